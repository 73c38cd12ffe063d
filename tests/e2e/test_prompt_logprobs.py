"""Prompt logprobs through the API: completions echo + logprobs return every prompt token's
logprob (the first null) and its top alternatives, `prompt_logprobs` returns vLLM's shape, and
the perplexity they give on the golden prompts equals what the stored reference logits give
(float32, within 1e-4 relative), for sluice-mini-moe and the fixture models. `sluice eval ppl`
and bench/ppl.py compute the same number through the API."""

import json
import math
import os
import pathlib
import subprocess
import sys
import tempfile

import pytest

from conftest import ServerProcess, sluice_bin
from golden_logprobs import golden_prompts, ppl, read_golden, reference_logprobs, reference_top

REPO = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = REPO.parent / "shared" / "fixtures"
MODELS = {
    "sluice-mini-moe": REPO / "models" / "sluice-mini-moe",
    "llama-tiny": FIXTURES / "llama-tiny",
    "qwen3-hybrid-tiny": FIXTURES / "qwen3-hybrid-tiny",
    "deepseek-v3-tiny": FIXTURES / "deepseek-v3-tiny",
}
REL_TOL = 1e-4


def echo_logprobs(client, model, ids, k=0):
    r = client.completions.create(model=model, prompt=ids, max_tokens=1, echo=True, logprobs=k,
                                  temperature=0,
                                  extra_body={"return_tokens_as_token_ids": True})
    return r


@pytest.fixture(scope="module", params=list(MODELS))
def served(request, client, model, base_url):
    """(client, model name, golden tensors, base URL) per model; mini-moe uses the session
    server."""
    import openai
    name = request.param
    golden = read_golden(MODELS[name] / "golden.safetensors")
    if name == "sluice-mini-moe":
        yield client, model, golden, base_url
        return
    server = ServerProcess(model_dir=MODELS[name])
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=300)
    try:
        yield c, name, golden, server.url
    finally:
        assert server.stop() == 0


def test_echo_logprobs_perplexity_equals_reference(served):
    client, model, golden, _ = served
    prompts = golden_prompts(golden)
    for i in prompts:
        ids, want = reference_logprobs(golden, i)
        r = echo_logprobs(client, model, ids, k=2)
        lp = r.choices[0].logprobs
        # Prompt tokens then the generated one; the first prompt token has no logprob.
        assert [int(t.split(":")[1]) for t in lp.tokens[:len(ids)]] == ids
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        got = lp.token_logprobs[1:len(ids)]
        assert len(got) == len(want)
        assert math.isclose(ppl(got), ppl(want), rel_tol=REL_TOL), (model, i, ppl(got),
                                                                   ppl(want))
        # Top alternatives (besides the prompt token) follow the reference's order.
        for p in (1, len(ids) // 2, len(ids) - 1):
            top = lp.top_logprobs[p]
            want_top = reference_top(golden, i, p - 1, 2)
            got_ids = sorted(top, key=lambda t: -top[t])
            assert [int(t.split(":")[1]) for t in got_ids][:2] == want_top or \
                ids[p] not in want_top, (p, top, want_top)
        assert r.usage.prompt_tokens == len(ids)
        assert r.choices[0].text.startswith("")


def test_prompt_logprobs_field_vllm_shape(client, model):
    golden = read_golden(MODELS["sluice-mini-moe"] / "golden.safetensors")
    ids, want = reference_logprobs(golden, 1)
    r = client.completions.create(model=model, prompt=ids, max_tokens=2, temperature=0,
                                  extra_body={"prompt_logprobs": 3})
    pl = r.model_extra["choices"][0]["prompt_logprobs"] if r.model_extra.get("choices") else \
        r.choices[0].model_extra["prompt_logprobs"]
    assert pl[0] is None and len(pl) == len(ids)
    for p in range(1, len(ids)):
        entry = pl[p]
        assert str(ids[p]) in entry
        assert math.isclose(entry[str(ids[p])]["logprob"], want[p - 1], abs_tol=2e-4)
        ranks = sorted(v["rank"] for k, v in entry.items() if k != str(ids[p]))
        assert ranks[:3] == [1, 2, 3] or len(entry) == 3
        top1 = reference_top(golden, 1, p - 1, 1)[0]
        assert entry[str(top1)]["rank"] == 1
    # Chat: vLLM puts prompt_logprobs on the response.
    c = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}],
                                       max_tokens=1, extra_body={"prompt_logprobs": 0})
    pl = c.model_extra["prompt_logprobs"]
    assert pl[0] is None and len(pl) == c.usage.prompt_tokens


def test_streamed_echo_logprobs_equal_non_streamed(client, model):
    prompt = "Ge1:1 In the beginning God created the heaven"
    full = client.completions.create(model=model, prompt=prompt, max_tokens=4, echo=True,
                                     logprobs=1, temperature=0)
    chunks = list(client.completions.create(model=model, prompt=prompt, max_tokens=4, echo=True,
                                            logprobs=1, temperature=0, stream=True))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == full.choices[0].text
    tokens, logprobs = [], []
    for c in chunks:
        if c.choices and c.choices[0].logprobs:
            tokens += c.choices[0].logprobs.tokens
            logprobs += c.choices[0].logprobs.token_logprobs
    assert tokens == full.choices[0].logprobs.tokens
    assert logprobs == full.choices[0].logprobs.token_logprobs
    assert full.choices[0].logprobs.text_offset[0] == 0


def test_eval_ppl_subcommand_and_bench_script(served):
    """The golden prompts as text (they re-encode to the same ids): `sluice eval ppl` and
    bench/ppl.py give the reference perplexity over all of them, and bench/ppl.py --reference
    (the golden prompts as ids) reports the served and the reference perplexity."""
    import tokenizers
    _, model, golden, base_url = served
    name = model if model in MODELS else "sluice-mini-moe"
    tok = tokenizers.Tokenizer.from_file(str(MODELS[name] / "tokenizer.json"))
    prompts = golden_prompts(golden)
    want, per_text = [], []
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for i in prompts:
            ids, lp = reference_logprobs(golden, i)
            text = tok.decode(ids, skip_special_tokens=False)
            assert tok.encode(text, add_special_tokens=False).ids == ids
            f.write(json.dumps({"text": text}) + "\n")
            want += lp
            per_text.append(lp)
        path = f.name
    out = subprocess.run([sluice_bin(), "eval", "ppl", path, "--url", base_url,
                          "--no-special-tokens"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["model"] == model and result["num_texts"] == len(prompts)
    assert result["num_tokens"] == len(want)
    for t, lp in zip(result["texts"], per_text):
        assert t["num_tokens"] == len(lp)
        assert math.isclose(t["ppl"], ppl(lp), rel_tol=REL_TOL), (model, t, ppl(lp))
    assert math.isclose(result["ppl"], ppl(want), rel_tol=REL_TOL), (result["ppl"], ppl(want))
    bench = str(REPO / "bench" / "ppl.py")
    b = subprocess.run([sys.executable, bench, path, "--url", base_url, "--no-special-tokens",
                        "--json"], capture_output=True, text=True, timeout=300)
    assert b.returncode == 0, b.stderr
    b = json.loads(b.stdout)
    assert b["num_tokens"] == len(want)
    assert math.isclose(b["ppl"], result["ppl"], rel_tol=1e-9)
    ref = subprocess.run([sys.executable, bench, "--url", base_url, "--reference",
                          str(MODELS[name]), "--json"], capture_output=True, text=True,
                         timeout=300)
    assert ref.returncode == 0, ref.stderr
    ref = json.loads(ref.stdout)
    assert ref["ok"] and ref["rel_err"] <= REL_TOL and ref["num_tokens"] == len(want)
    assert math.isclose(ref["reference_ppl"], ppl(want), rel_tol=1e-12)
    assert math.isclose(ref["ppl"], result["ppl"], rel_tol=REL_TOL)
    for row, lp in zip(ref["prompts"], per_text):
        assert row["num_tokens"] == len(lp)
        assert math.isclose(row["reference_ppl"], ppl(lp), rel_tol=1e-12)


def test_eval_ppl_refuses_bad_files(base_url):
    """A text file that is not UTF-8, or holds no text, is a clear error (exit 1), not a crash."""
    with tempfile.TemporaryDirectory() as d:
        cases = {"bad_utf8.txt": b"ok\n\xff\xfe\n", "empty.txt": b"\n  \n"}
        for name, data in cases.items():
            path = os.path.join(d, name)
            with open(path, "wb") as f:
                f.write(data)
            out = subprocess.run([sluice_bin(), "eval", "ppl", path, "--url", base_url],
                                 capture_output=True, text=True, timeout=60)
            assert out.returncode == 1, (name, out.returncode, out.stderr)
            want = "2: not valid UTF-8" if name == "bad_utf8.txt" else "no text to score"
            assert want in out.stderr, (name, out.stderr)


def golden_text(tok, min_tokens):
    """KJV verses, plain English and fortunes of the tokenizer goldens on one line, as many
    as give at least min_tokens tokens."""
    golden = json.loads((FIXTURES / "tokenizer" / "tokenizer_golden.json").read_text())
    parts = []
    for case in golden["cases"]:
        if case["category"] in ("kjv", "plain", "fortune"):
            parts.append(case["text"].replace("\n", " "))
            if len(tok.encode(" ".join(parts)).ids) >= min_tokens:
                return " ".join(parts)
    raise AssertionError(f"the goldens hold fewer than {min_tokens} tokens")


def windows_logprobs(base_url, model, ids, max_length, stride):
    """Strided-window scoring done here, request by request: each window of at most
    max_length tokens ends `stride` tokens after the previous one and scores those."""
    import urllib.request
    out, scored_to, windows = [], 0, 0
    while scored_to < len(ids):
        end = min(len(ids), max_length if scored_to == 0 else scored_to + stride)
        begin = max(0, end - max_length)
        body = {"model": model, "prompt": ids[begin:end], "max_tokens": 1, "echo": True,
                "logprobs": 0, "temperature": 0}
        req = urllib.request.Request(base_url + "/v1/completions",
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as r:
            lp = json.loads(r.read())["choices"][0]["logprobs"]["token_logprobs"]
        out += lp[max(scored_to, 1) - begin:end - begin]
        scored_to, windows = end, windows + 1
    return out, windows


def test_eval_ppl_windows_score_texts_longer_than_the_context(served):
    """`sluice eval ppl --tokenizer` and bench/ppl.py --tokenizer cut a text longer than the
    context into strided windows of token ids; their perplexity equals scoring those windows
    one by one, every token after the first is scored once, and the first window's tokens
    (full context) equal the reference. Without --tokenizer such a text is a clear error."""
    import tokenizers
    client, model, golden, base_url = served
    name = model if model in MODELS else "sluice-mini-moe"
    (entry,) = [m for m in client.models.list().data if m.id == model]
    max_model_len = entry.model_extra["max_model_len"]
    tok = tokenizers.Tokenizer.from_file(str(MODELS[name] / "tokenizer.json"))
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "long.txt")
        # Refused whole: the server's context error, with the way out.
        with open(path, "w") as f:
            f.write(golden_text(tok, max_model_len + 1) + "\n")
        out = subprocess.run([sluice_bin(), "eval", "ppl", path, "--url", base_url],
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 1 and "maximum context length" in out.stderr, out.stderr
        assert "--tokenizer" in out.stderr
        # Windows: max_model_len - 1 tokens by default (the fixtures: 511; sluice-mini-moe,
        # 2048 tokens of context, gets --max-length 128 to keep the test short), stride half.
        max_length = max_model_len - 1 if max_model_len <= 512 else 128
        stride = max_length // 2
        text = golden_text(tok, max_length + 100)
        ids = tok.encode(text).ids
        assert len(ids) > max_length  # two windows at least
        with open(path, "w") as f:
            f.write(text + "\n")
        args = ["--tokenizer", str(MODELS[name])]
        if max_length != max_model_len - 1:
            args += ["--max-length", str(max_length)]
        out = subprocess.run([sluice_bin(), "eval", "ppl", path, "--url", base_url, *args],
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        result = json.loads(out.stdout)
        want, num_windows = windows_logprobs(base_url, model, ids, max_length, stride)
        assert len(want) == len(ids) - 1
        assert result["num_tokens"] == len(ids) - 1 and result["num_windows"] == num_windows
        assert num_windows == 1 + -(-(len(ids) - max_length) // stride)
        assert (result["max_length"], result["stride"]) == (max_length, stride)
        assert math.isclose(result["ppl"], ppl(want), rel_tol=1e-6), (result["ppl"], ppl(want))
        bench = subprocess.run([sys.executable, str(REPO / "bench" / "ppl.py"), path, "--url",
                                base_url, *args, "--json"],
                               capture_output=True, text=True, timeout=300)
        assert bench.returncode == 0, bench.stderr
        b = json.loads(bench.stdout)
        assert (b["num_tokens"], b["num_windows"]) == (len(ids) - 1, num_windows)
        assert math.isclose(b["ppl"], result["ppl"], rel_tol=1e-6)
        # A golden prompt in windows of 16 tokens: the first window sees the whole prefix, so
        # its tokens carry the reference logprobs; the text as a whole is scored once.
        gids, ref = reference_logprobs(golden, 3)
        with open(path, "w") as f:
            f.write(json.dumps({"text": tok.decode(gids, skip_special_tokens=False)}) + "\n")
        out = subprocess.run([sluice_bin(), "eval", "ppl", path, "--url", base_url,
                              "--tokenizer", str(MODELS[name]), "--no-special-tokens",
                              "--max-length", "16", "--stride", "8"],
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        result = json.loads(out.stdout)
        want, num_windows = windows_logprobs(base_url, model, gids, 16, 8)
        assert max(abs(a - b) for a, b in zip(want[:15], ref[:15])) < 2e-4
        assert result["num_tokens"] == len(gids) - 1 and result["num_windows"] == num_windows
        assert math.isclose(result["ppl"], ppl(want), rel_tol=1e-6)
        # Windows need token ids, and a stride within the window.
        for bad, why in ((["--max-length", "16"], "need --tokenizer"),
                         (["--tokenizer", str(MODELS[name]), "--max-length", "16", "--stride",
                           "16"], "--stride must be in [1, max-length - 1 = 15]"),
                         (["--tokenizer", str(MODELS[name]), "--max-length", "1"],
                          "--max-length must be at least 2")):
            out = subprocess.run([sluice_bin(), "eval", "ppl", path, "--url", base_url, *bad],
                                 capture_output=True, text=True, timeout=60)
            assert out.returncode == 1 and why in out.stderr, (bad, out.stderr)


def test_max_tokens_zero_with_echo_scores_the_prompt_only(client, model, base_url):
    """max_tokens 0 with echo (vLLM, the legacy OpenAI API): the reply holds the prompt and its
    logprobs and nothing generated, streamed or not; without echo, on chat, with min_tokens or
    a prompt that fills the context it is a 400, and the server goes on."""
    import openai
    golden = read_golden(MODELS["sluice-mini-moe"] / "golden.safetensors")
    ids, want = reference_logprobs(golden, 2)
    kw = dict(model=model, prompt=ids, max_tokens=0, echo=True, logprobs=1, temperature=0)
    r = client.completions.create(**kw, extra_body={"return_tokens_as_token_ids": True})
    c = r.choices[0]
    assert [int(t.split(":")[1]) for t in c.logprobs.tokens] == ids  # the prompt, no more
    assert c.logprobs.token_logprobs[0] is None
    got = c.logprobs.token_logprobs[1:]
    assert max(abs(a - b) for a, b in zip(got, want)) < 2e-4
    assert math.isclose(ppl(got), ppl(want), rel_tol=REL_TOL)
    assert c.finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(ids), 0)
    # The text is the prompt's: with max_tokens 1 the echo is followed by the generated token.
    echo1 = client.completions.create(model=model, prompt=ids, max_tokens=1, echo=True,
                                      temperature=0).choices[0].text
    generated = client.completions.create(model=model, prompt=ids, max_tokens=1,
                                          temperature=0).choices[0].text
    assert c.text + generated == echo1 and c.text
    # Streamed: the same text and tokens, then "length".
    chunks = list(client.completions.create(**kw, stream=True,
                                            stream_options={"include_usage": True}))
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == c.text
    streamed = [lp for ch in chunks if ch.choices and ch.choices[0].logprobs
                for lp in ch.choices[0].logprobs.token_logprobs]
    assert streamed == c.logprobs.token_logprobs
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 0
    # Text prompt without logprobs: the prompt echoed.
    r = client.completions.create(model=model, prompt="In the beginning", max_tokens=0,
                                  echo=True)
    assert r.choices[0].text == "In the beginning" and r.usage.completion_tokens == 0
    # Refused: 0 needs echo and completions; min_tokens above it; no room after the prompt.
    max_model_len = client.models.list().data[0].model_extra["max_model_len"]
    bad = [
        (lambda: client.completions.create(model=model, prompt=ids, max_tokens=0), "max_tokens"),
        (lambda: client.completions.create(model=model, prompt=ids, max_tokens=0, echo=False),
         "max_tokens"),
        (lambda: client.chat.completions.create(model=model, max_tokens=0,
                                                messages=[{"role": "user", "content": "Hi"}]),
         "max_tokens"),
        (lambda: client.completions.create(model=model, prompt=ids, max_tokens=0, echo=True,
                                           extra_body={"min_tokens": 1}), "min_tokens"),
        (lambda: client.completions.create(model=model, prompt=[5] * max_model_len,
                                           max_tokens=0, echo=True), "prompt"),
    ]
    for call, param in bad:
        with pytest.raises(openai.BadRequestError) as e:
            call()
        assert e.value.body["param"] == param, e.value.body
    r = client.completions.create(model=model, prompt=[5] * (max_model_len - 1), max_tokens=0,
                                  echo=True, logprobs=0)
    assert len(r.choices[0].logprobs.tokens) == max_model_len - 1
    assert r.usage.completion_tokens == 0
