"""MTP speculative decoding through `sluice serve` (`--speculative-method mtp`, CPU engine) on
tests/fixtures/deepseek-v3-tiny-mtp: greedy answers to the golden prompts (token ids) equal the
plain server's, tokens and logprobs, n = 2 included, and /metrics reports accepted drafts; a
target whose checkpoint has no MTP weights (sluice-mini-moe) is refused at start-up with a
message naming them, so is mtp with --speculative-model, and so is mtp on an expert-parallel
replica (with and without EPLB), naming the sharding rather than a missing module."""

import subprocess
import urllib.request

import openai
import pytest
from safetensors.numpy import load_file

from conftest import MODEL_DIR, REPO, ServerProcess, sluice_bin

FIXTURE = REPO / "tests" / "fixtures" / "deepseek-v3-tiny-mtp"
GOLDEN = REPO.parent / "shared" / "fixtures" / "deepseek-v3-tiny" / "golden.safetensors"


def start(args):
    proc = ServerProcess(extra_args=args, model_dir=FIXTURE)
    client = openai.OpenAI(base_url=proc.url + "/v1", api_key="x", max_retries=0, timeout=300)
    return proc, client


@pytest.fixture(scope="module")
def servers():
    plain = start([])
    mtp = start(["--speculative-method", "mtp", "--speculative-verify", "3"])
    yield plain, mtp
    for proc, _ in (plain, mtp):
        assert proc.stop() == 0, proc.logs()


def metric(url, name):
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} missing from /metrics")


def test_greedy_equals_plain_and_golden(servers):
    (_, plain), (mtp_proc, mtp) = servers
    name = plain.models.list().data[0].id
    golden = load_file(str(GOLDEN))
    for i in range(3):
        prompt = [int(t) for t in golden[f"input_ids_{i}"]]
        kwargs = dict(model=name, prompt=prompt, temperature=0, max_tokens=32, logprobs=1)
        a = plain.completions.create(**kwargs)
        b = mtp.completions.create(**kwargs)
        assert a.choices[0].text == b.choices[0].text
        assert a.choices[0].logprobs.tokens == b.choices[0].logprobs.tokens
        assert a.choices[0].logprobs.token_logprobs == pytest.approx(
            b.choices[0].logprobs.token_logprobs, abs=1e-3)
        assert b.usage.completion_tokens == 32
    # Two choices of one prompt: each equals the single greedy answer.
    prompt = [int(t) for t in golden["input_ids_0"]]
    one = plain.completions.create(model=name, prompt=prompt, temperature=0, max_tokens=20)
    two = mtp.completions.create(model=name, prompt=prompt, temperature=0, max_tokens=20, n=2)
    assert [c.text for c in two.choices] == [one.choices[0].text] * 2
    drafts = metric(mtp_proc.url, "sluice_spec_decode_num_draft_tokens_total")
    accepted = metric(mtp_proc.url, "sluice_spec_decode_num_accepted_tokens_total")
    assert 0 < accepted < drafts


def test_sampled_requests_complete(servers):
    _, (_, mtp) = servers
    name = mtp.models.list().data[0].id
    out = mtp.completions.create(model=name, prompt="Psa23:1 The LORD", temperature=0.8,
                                 seed=7, max_tokens=24, extra_body={"ignore_eos": True})
    assert out.usage.completion_tokens == 24


def test_target_without_mtp_weights_is_refused():
    proc = subprocess.run([sluice_bin(), "serve", "--model", str(MODEL_DIR), "--port", "0",
                           "--speculative-method", "mtp"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "--speculative-method mtp" in out and str(MODEL_DIR) in out
    assert "num_nextn_predict_layers = 1 but has no MTP weights" in out
    assert "model.layers.8.eh_proj.weight" in out


def test_mtp_with_a_draft_model_is_refused():
    proc = subprocess.run([sluice_bin(), "serve", "--model", str(FIXTURE), "--port", "0",
                           "--speculative-method", "mtp", "--speculative-model", str(FIXTURE)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2  # a usage error, before the model loads
    assert "--speculative-method mtp drafts with the target's own MTP module: drop " \
        "--speculative-model" in proc.stdout + proc.stderr


@pytest.mark.parametrize("flags,reason", [
    (["--expert-parallel-size", "2", "--enable-eplb"],
     "--enable-eplb: the model is split over expert-parallel ranks whose experts EPLB moves"),
    (["--expert-parallel-size", "2"],
     "the model is sharded over tensor/expert-parallel ranks (TP/EP)"),
], ids=["ep2-eplb", "ep2"])
def test_mtp_on_expert_parallel_replica_names_the_reason(flags, reason):
    # The fixture has MTP weights: the refusal must blame the sharding, not a missing module.
    proc = subprocess.run([sluice_bin(), "serve", "--model", str(FIXTURE), "--port", "0",
                           "--speculative-method", "mtp", *flags],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "--speculative-method mtp: the target model" in out and reason in out
    assert "no MTP module" not in out
