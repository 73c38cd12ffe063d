"""Speculative decoding through `sluice serve` / `sluice generate` (CPU engine): greedy answers
with a draft model (--speculative-model, confidence-scheduled by default) and with n-gram lookup
equal the plain session server's — n > 1, logprobs, stop strings, max_tokens, penalties — and
/metrics reports acceptance; a draft of another vocabulary or tokenizer and an out-of-range
--num-speculative-tokens are refused at start-up."""

import json
import pathlib
import shutil
import subprocess
import urllib.request

import openai
import pytest

from conftest import MODEL_DIR, MODEL_NAME, REPO, ServerProcess, sluice_bin

DRAFT_DIR = REPO.parent / "shared" / "models" / "sluice-mini-draft"
PROMPTS = ["Ge1:1 In the beginning God created the heaven and the earth.\nGe1:2",
           "Psa23:1 The LORD is my shepherd; I shall not want.\nPsa23:2",
           "Joh3:16 For God so loved the world,"]


def spec_client(args):
    proc = ServerProcess(extra_args=args)
    return proc, openai.OpenAI(base_url=proc.url + "/v1", api_key="x", max_retries=0,
                               timeout=300)


@pytest.fixture(scope="module")
def draft_server():
    proc, client = spec_client(["--speculative-model", str(DRAFT_DIR)])
    yield proc, client
    assert proc.stop() == 0, proc.logs()


@pytest.fixture(scope="module")
def ngram_server():
    proc, client = spec_client(["--speculative-method", "ngram", "--speculative-verify", "5"])
    yield proc, client
    assert proc.stop() == 0, proc.logs()


def completions(client, prompt, **kwargs):
    return client.completions.create(model=MODEL_NAME, prompt=prompt, temperature=0, **kwargs)


def same_choices(a, b):
    assert [c.text for c in a.choices] == [c.text for c in b.choices]
    assert [c.finish_reason for c in a.choices] == [c.finish_reason for c in b.choices]
    assert a.usage.completion_tokens == b.usage.completion_tokens
    for x, y in zip(a.choices, b.choices):
        if x.logprobs is None:
            continue
        assert x.logprobs.tokens == y.logprobs.tokens
        assert x.logprobs.token_logprobs == pytest.approx(y.logprobs.token_logprobs, abs=1e-3)
        assert [sorted(t) for t in x.logprobs.top_logprobs] == \
            [sorted(t) for t in y.logprobs.top_logprobs]


@pytest.mark.parametrize("which", ["draft_server", "ngram_server"])
def test_greedy_equals_plain(which, request, client):
    _, spec = request.getfixturevalue(which)
    for prompt in PROMPTS:
        kwargs = dict(max_tokens=40, n=2, logprobs=2)
        same_choices(completions(client, prompt, **kwargs), completions(spec, prompt, **kwargs))
        kwargs = dict(max_tokens=11, frequency_penalty=0.7, presence_penalty=0.3)
        same_choices(completions(client, prompt, **kwargs), completions(spec, prompt, **kwargs))


QUOTE = ("Num7:13 And his offering was one silver charger, the weight thereof was an hundred and "
         "thirty shekels, one silver bowl of seventy shekels, after the shekel of the sanctuary; "
         "both of them were full of fine flour mingled with oil for a meat offering:\n"
         "Num7:14 One spoon of ten shekels of gold, full of incense:\n"
         "Num7:18 On the second day Nethaneel the son of Zuar, prince of Issachar, did offer:\n"
         "Num7:19 He offered for his offering one silver charger,")


def test_seeded_sampling_with_ngram_auto_is_the_plain_output(client):
    # n-gram drafts are deterministic proposals: each position keeps its own seeded draw, so a
    # seed gives the plain server's text however many drafts auto verifies in each step.
    proc, spec = spec_client(["--speculative-method", "ngram"])  # --speculative-verify auto
    try:
        for seed, temperature in ((42, 0.8), (7, 0.4)):
            kwargs = dict(model=MODEL_NAME, prompt=QUOTE, max_tokens=40, seed=seed,
                          temperature=temperature, logprobs=1)
            want = client.completions.create(**kwargs)
            for _ in range(3):
                same_choices(want, spec.completions.create(**kwargs))
        with urllib.request.urlopen(proc.url + "/metrics", timeout=30) as r:
            metrics = r.read().decode()
        accepted = [line for line in metrics.splitlines()
                    if line.startswith("sluice_spec_decode_num_accepted_tokens_total")]
        assert accepted and float(accepted[0].split()[-1]) > 0, accepted
    finally:
        assert proc.stop() == 0, proc.logs()


def test_stop_strings_and_chat(draft_server, client):
    _, spec = draft_server
    plain = completions(client, PROMPTS[0], max_tokens=40)
    words = plain.choices[0].text.split()
    assert len(words) > 6
    stop = " " + words[5]  # a stop string inside the greedy text
    for include in (False, True):
        extra = {"include_stop_str_in_output": include}
        a = completions(client, PROMPTS[0], max_tokens=40, stop=[stop], extra_body=extra)
        b = completions(spec, PROMPTS[0], max_tokens=40, stop=[stop], extra_body=extra)
        assert a.choices[0].finish_reason == "stop"
        same_choices(a, b)
    messages = [{"role": "user", "content": "Quote Genesis 1:3."}]
    a = client.chat.completions.create(model=MODEL_NAME, messages=messages, temperature=0,
                                       max_tokens=32)
    b = spec.chat.completions.create(model=MODEL_NAME, messages=messages, temperature=0,
                                     max_tokens=32)
    assert a.choices[0].message.content == b.choices[0].message.content
    assert a.usage == b.usage


SCHEMA = {"type": "object",
          "properties": {"book": {"enum": ["Genesis", "Exodus", "Psalms"]},
                         "chapter": {"type": "integer", "minimum": 1, "maximum": 150},
                         "words": {"type": "array", "items": {"type": "string", "maxLength": 12},
                                   "minItems": 2, "maxItems": 3}},
          "required": ["book", "chapter", "words"], "additionalProperties": False}


@pytest.fixture(scope="module")
def draft_fixed_server():
    # Fixed k: every step drafts (auto may find no drafting worth it for these JSON texts).
    proc, client = spec_client(["--speculative-model", str(DRAFT_DIR), "--speculative-verify", "4"])
    yield proc, client
    assert proc.stop() == 0, proc.logs()


def test_structured_output_drafts_are_checked_against_the_grammar(draft_fixed_server, client):
    """A json_schema request drafts too; drafts the grammar refuses are rejected when verified:
    greedy text equal to the plain server's, valid at temperature 1 with several seeds."""
    import jsonschema
    proc, spec = draft_fixed_server
    fmt = {"type": "json_schema", "json_schema": {"name": "verse", "schema": SCHEMA,
                                                  "strict": True}}
    messages = [{"role": "user", "content": "Which verse? Answer in JSON."}]
    before = metric(proc.url, "sluice_spec_decode_num_draft_tokens_total")
    a = client.chat.completions.create(model=MODEL_NAME, messages=messages, temperature=0,
                                       max_tokens=120, response_format=fmt)
    b = spec.chat.completions.create(model=MODEL_NAME, messages=messages, temperature=0,
                                     max_tokens=120, response_format=fmt)
    assert b.choices[0].message.content == a.choices[0].message.content
    assert b.choices[0].finish_reason == a.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(b.choices[0].message.content), SCHEMA)
    for seed in (1, 2, 3):
        c = spec.chat.completions.create(model=MODEL_NAME, messages=messages, temperature=1.0,
                                         seed=seed, max_tokens=120, response_format=fmt)
        assert c.choices[0].finish_reason == "stop", c.choices[0].message.content
        jsonschema.validate(json.loads(c.choices[0].message.content), SCHEMA)
    assert metric(proc.url, "sluice_spec_decode_num_draft_tokens_total") > before


def metric(url, name):
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} missing from /metrics")


def test_metrics_report_acceptance(draft_server):
    proc, spec = draft_server
    completions(spec, PROMPTS[1], max_tokens=24)
    drafts = metric(proc.url, "sluice_spec_decode_num_draft_tokens_total")
    accepted = metric(proc.url, "sluice_spec_decode_num_accepted_tokens_total")
    verifications = metric(proc.url, "sluice_spec_decode_num_drafts_total")
    assert drafts > 0 and verifications > 0 and 0 < accepted <= drafts
    assert metric(proc.url, "sluice_spec_decode_acceptance_rate") == pytest.approx(
        accepted / drafts, rel=1e-3)
    assert metric(proc.url, "sluice_spec_decode_mean_accepted_length") == pytest.approx(
        (accepted + verifications) / verifications, rel=1e-3)
    assert metric(proc.url, "sluice_spec_decode_draft_seconds_total") > 0
    assert metric(proc.url, "sluice_spec_decode_verify_seconds_total") > 0


def start_fails(args):
    proc = subprocess.run([sluice_bin(), "serve", "--model", str(MODEL_DIR), "--port", "0",
                           *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    return proc.stdout + proc.stderr


def test_mismatched_draft_is_refused(tmp_path):
    # Another vocabulary.
    small = REPO / "tests" / "fixtures" / "spec-tiny"
    out = start_fails(["--speculative-model", str(small)])
    assert str(small) in out and str(MODEL_DIR) in out and "vocab_size 64 vs 8192" in out
    # Same vocabulary size, another tokenizer (two tokens swapped).
    draft = tmp_path / "draft"
    draft.mkdir()
    shutil.copy(DRAFT_DIR / "config.json", draft / "config.json")
    tok = json.loads((DRAFT_DIR / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    a, b = [k for k, v in vocab.items() if v in (300, 301)]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (draft / "tokenizer.json").write_text(json.dumps(tok))
    out = start_fails(["--speculative-model", str(draft)])
    assert str(draft) in out and str(MODEL_DIR) in out and "tokenizers differ at id 300" in out


def usage_error(args, command="serve"):
    """Runs `sluice COMMAND --model ... ARGS`, which must stop at the command line: exit 2, one
    "sluice: error: ..." line, before any model loads."""
    proc = subprocess.run([sluice_bin(), command, "--model", str(MODEL_DIR), *args],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "loading model" not in proc.stdout + proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[0].startswith("sluice: error: ") and lines[1].startswith(f"Run 'sluice {command}")
    return lines[0][len("sluice: error: "):]


@pytest.mark.parametrize("k", ["0", "17", "-1"])
def test_num_speculative_tokens_out_of_range_is_refused(k):
    assert usage_error(["--speculative-method", "ngram", "--num-speculative-tokens", k]) == (
        f"--num-speculative-tokens: invalid value '{k}' (expected an integer in [1, 16])")


@pytest.mark.parametrize("args,message", [
    (["--speculative-method", "ngram", "--speculative-verify", "foo"],
     "--speculative-verify: invalid value 'foo' (expected auto or an integer in [1, 16])"),
    (["--speculative-method", "ngram", "--speculative-verify", "17"],
     "--speculative-verify: invalid value '17' (expected auto or an integer in [1, 16])"),
    (["--num-speculative-tokens", "4"],
     "--num-speculative-tokens needs a drafter: --speculative-model DIR or --speculative-method"),
    (["--speculative-verify", "3"],
     "--speculative-verify needs a drafter: --speculative-model DIR or --speculative-method"),
    (["--speculative-method", "ngram", "--speculative-model", str(DRAFT_DIR)],
     "--speculative-method ngram does not use a draft model: drop --speculative-model"),
    (["--speculative-method", "ngram", "--speculative-draft-vocab", "100"],
     "--speculative-draft-vocab restricts a draft model's LM head; --speculative-method ngram "
     "has none"),
    (["--speculative-model", str(DRAFT_DIR), "--prompt-lookup-min", "2"],
     "--prompt-lookup-min/max set n-gram lookup; --speculative-method is draft_model"),
    (["--speculative-method", "ngram", "--prompt-lookup-min", "5", "--prompt-lookup-max", "2"],
     "--prompt-lookup-min 5 is above --prompt-lookup-max 2"),
    (["--speculative-method", "ngram", "--speculative-verify", "8",
      "--num-speculative-tokens", "3"],
     "--speculative-verify 8 fixes k = 8 but --num-speculative-tokens is 3: give one"),
    (["--speculative-method", "ngram", "--speculative-verify", "08",
      "--num-speculative-tokens", "3"],
     "--speculative-verify 08 fixes k = 8 but --num-speculative-tokens is 3: give one"),
    (["--speculative-model", ""], "--speculative-model: empty path"),
    (["--speculative-method", "draft_model"],
     "--speculative-method draft_model needs --speculative-model DIR"),
], ids=["verify-word", "verify-range", "k-without-drafter", "verify-without-drafter",
        "ngram-with-model", "draft-vocab-with-ngram", "lookup-with-draft-model",
        "lookup-min-above-max", "verify-contradicts-k", "verify-contradicts-k-leading-zero",
        "empty-model", "draft-method-without-model"])
def test_contradictory_speculative_flags_are_usage_errors(args, message):
    assert usage_error(args) == message


def test_speculative_usage_errors_on_generate_and_decode():
    assert usage_error(["--input", "x", "--output", "y", "--speculative-method", "ngram",
                        "--speculative-draft-vocab", "9"], command="generate").startswith(
        "--speculative-draft-vocab restricts")
    assert usage_error(["--router", "localhost:1", "--speculative-method", "ngram",
                        "--speculative-verify", "x"], command="decode").startswith(
        "--speculative-verify: invalid value 'x'")


def test_unloadable_draft_model_errors_name_the_flag(tmp_path):
    broken = tmp_path / "broken-draft"
    shutil.copytree(DRAFT_DIR, broken)
    (broken / "model.safetensors").write_bytes(b"")
    for draft, detail in ((tmp_path / "missing", "config.json"),
                          (broken, "file too small for a safetensors header")):
        out = start_fails(["--speculative-model", str(draft)])
        assert f"--speculative-model {draft}: cannot load the draft model: " in out, out
        assert detail in out, out


def test_draft_vocab_above_the_vocabulary_is_refused():
    out = start_fails(["--speculative-model", str(DRAFT_DIR), "--speculative-draft-vocab",
                       "100000"])
    assert "--speculative-draft-vocab must be in [0, 8192] (the vocabulary), got 100000" in out


def test_generate_with_draft_model(tmp_path, client):
    lines = [{"custom_id": str(i), "prompt": p, "max_tokens": 24, "temperature": 0}
             for i, p in enumerate(PROMPTS)]
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("\n".join(json.dumps(l) for l in lines) + "\n")
    # "04" and 4 are the same k: numbers, not strings, are compared.
    proc = subprocess.run([sluice_bin(), "generate", "--model", str(MODEL_DIR), "--input",
                           str(src), "--output", str(dst), "--speculative-model", str(DRAFT_DIR),
                           "--speculative-verify", "04", "--num-speculative-tokens", "4"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    out = [json.loads(l) for l in dst.read_text().splitlines()]
    for i, p in enumerate(PROMPTS):
        plain = completions(client, p, max_tokens=24)
        assert out[i]["choices"][0]["text"] == plain.choices[0].text
