"""Speculative decoding on `sluice serve --device cuda` (a GPU machine: SLUICE_TEST_DEVICE=cuda;
skipped otherwise — the CPU engine's answers are tests/e2e/test_speculative.py's).

The target verifies drafts on the GPU (k + 1 query tokens and logits rows per decode sequence,
replaying the multi-token decode graphs, or eagerly with --enforce-eager), and the draft model
runs in a CUDA runner of its own on the same GPU. With --batch-invariant a verify row's logits are those
of the same position decoded alone, so greedy answers with speculation equal the plain CUDA
server's token for token: the sluice-mini-draft draft model for sluice-mini-moe (auto
verification) and n-gram lookup on llama-tiny (fixed k), with n = 2, logprobs, penalties and stop
strings. Without --batch-invariant the server still drafts, accepts and finishes seeded sampled
and greedy requests at their lengths (token equality there is the engine test's, which allows
bf16 near-ties: engine/cuda/cuda_spec_test.cc). MTP on CUDA is refused at start-up naming the
reason."""

import os
import subprocess

import openai
import pytest

from conftest import MODEL_DIR, REPO, ServerProcess, sluice_bin
from test_speculative import metric, same_choices

DEVICE = os.environ.get("SLUICE_TEST_DEVICE", "cpu")
pytestmark = pytest.mark.skipif(DEVICE != "cuda",
                                reason="needs a GPU (SLUICE_TEST_DEVICE=cuda)")

DRAFT_DIR = REPO.parent / "shared" / "models" / "sluice-mini-draft"
LLAMA_DIR = REPO.parent / "shared" / "fixtures" / "llama-tiny"
MTP_DIR = REPO / "tests" / "fixtures" / "deepseek-v3-tiny-mtp"
# A fixed KV block count: no share of GPU memory to split between the servers of one test.
CUDA = ["--device", "cuda", "--num-kv-blocks", "4096"]
PROMPTS = ["Ge1:1 In the beginning God created the heaven and the earth.\nGe1:2",
           "Psa23:1 The LORD is my shepherd; I shall not want.\nPsa23:2",
           "Joh3:16 For God so loved the world,"]


def start(model_dir, args):
    proc = ServerProcess(extra_args=CUDA + args, model_dir=model_dir)
    client = openai.OpenAI(base_url=proc.url + "/v1", api_key="x", max_retries=0, timeout=300)
    return proc, client


@pytest.fixture
def pair(request):
    """A plain and a speculative CUDA server of one model; stopped after the test."""
    started = []

    def make(model_dir, spec_args, common=()):
        plain = start(model_dir, list(common))
        started.append(plain[0])
        spec = start(model_dir, list(common) + spec_args)
        started.append(spec[0])
        return plain, spec

    yield make
    for proc in started:
        assert proc.stop() == 0, proc.logs()


def name_of(client):
    return client.models.list().data[0].id


def completions(client, prompt, **kwargs):
    return client.completions.create(model=name_of(client), prompt=prompt, temperature=0,
                                     **kwargs)


def assert_drafts_accepted(url):
    drafts = metric(url, "sluice_spec_decode_num_draft_tokens_total")
    accepted = metric(url, "sluice_spec_decode_num_accepted_tokens_total")
    assert metric(url, "sluice_spec_decode_num_drafts_total") > 0
    assert 0 < accepted <= drafts
    assert metric(url, "sluice_spec_decode_verify_seconds_total") > 0


@pytest.mark.parametrize("model_dir,spec_args,prompts", [
    (MODEL_DIR, ["--speculative-model", str(DRAFT_DIR)], PROMPTS),
    (LLAMA_DIR, ["--speculative-method", "ngram", "--speculative-verify", "5"],
     ["the cat sat on the mat and the cat sat on the mat and the cat", "one two three one two"]),
    (MODEL_DIR, ["--speculative-model", str(DRAFT_DIR), "--enforce-eager"], PROMPTS),
], ids=["draft-model", "ngram", "draft-model-eager"])
def test_batch_invariant_greedy_equals_plain(pair, model_dir, spec_args, prompts):
    (_, plain), (spec_proc, spec) = pair(model_dir, spec_args, common=["--batch-invariant"])
    for prompt in prompts:
        kwargs = dict(max_tokens=40, n=2, logprobs=2)
        same_choices(completions(plain, prompt, **kwargs), completions(spec, prompt, **kwargs))
        kwargs = dict(max_tokens=11, frequency_penalty=0.7, presence_penalty=0.3)
        same_choices(completions(plain, prompt, **kwargs), completions(spec, prompt, **kwargs))
    words = completions(plain, prompts[0], max_tokens=40).choices[0].text.split()
    if len(words) > 6:
        stop = " " + words[5]  # a stop string inside the greedy text
        same_choices(completions(plain, prompts[0], max_tokens=40, stop=[stop]),
                     completions(spec, prompts[0], max_tokens=40, stop=[stop]))
    assert_drafts_accepted(spec_proc.url)


def test_default_kernels_draft_and_finish(pair):
    (_, plain), (spec_proc, spec) = pair(MODEL_DIR, ["--speculative-model", str(DRAFT_DIR),
                                                     "--speculative-verify", "4"])
    for prompt in PROMPTS:
        a = completions(plain, prompt, max_tokens=32, extra_body={"ignore_eos": True})
        b = completions(spec, prompt, max_tokens=32, extra_body={"ignore_eos": True})
        assert b.usage.completion_tokens == a.usage.completion_tokens == 32
        sampled = spec.completions.create(model=name_of(spec), prompt=prompt, temperature=0.8,
                                          seed=7, max_tokens=24, logprobs=1,
                                          extra_body={"ignore_eos": True})
        assert sampled.usage.completion_tokens == 24
        assert len(sampled.choices[0].logprobs.tokens) == 24
    assert_drafts_accepted(spec_proc.url)


def test_mtp_on_cuda_is_refused():
    proc = subprocess.run([sluice_bin(), "serve", "--model", str(MTP_DIR), "--port", "0", *CUDA,
                           "--speculative-method", "mtp"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "--speculative-method mtp" in out
    assert "the CUDA backend does not run MTP modules" in out
