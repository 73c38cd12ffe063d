"""Prompt logprobs through the API: completions echo + logprobs return every prompt token's
logprob (the first null) and its top alternatives, `prompt_logprobs` returns vLLM's shape, and
the perplexity they give on the golden prompts equals what the stored reference logits give
(float32, within 1e-4 relative), for sluice-mini-moe and the fixture models. `sluice eval ppl`
and bench/ppl.py compute the same number through the API."""

import array
import json
import math
import os
import pathlib
import subprocess
import sys
import tempfile

import pytest

from conftest import ServerProcess, sluice_bin

REPO = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = REPO.parent / "shared" / "fixtures"
MODELS = {
    "sluice-mini-moe": REPO / "models" / "sluice-mini-moe",
    "llama-tiny": FIXTURES / "llama-tiny",
    "qwen3-hybrid-tiny": FIXTURES / "qwen3-hybrid-tiny",
    "deepseek-v3-tiny": FIXTURES / "deepseek-v3-tiny",
}
REL_TOL = 1e-4


def read_safetensors(path):
    """{name: (dtype, shape, values)} for I64 and F32 tensors, pure Python."""
    data = pathlib.Path(path).read_bytes()
    header_len = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + header_len])
    base = 8 + header_len
    out = {}
    for name, info in header.items():
        if name == "__metadata__" or info["dtype"] not in ("I64", "F32"):
            continue
        begin, end = info["data_offsets"]
        values = array.array("q" if info["dtype"] == "I64" else "f")
        values.frombytes(data[base + begin:base + end])
        out[name] = (info["dtype"], info["shape"], values)
    return out


def reference_logprobs(golden, i):
    """log_softmax(logits[p])[ids[p + 1]] for every prompt position, in float64."""
    _, _, ids = golden[f"input_ids_{i}"]
    _, (rows, vocab), logits = golden[f"logits_{i}"]
    out = []
    for p in range(rows - 1):
        row = logits[p * vocab:(p + 1) * vocab]
        m = max(row)
        lse = m + math.log(math.fsum(math.exp(x - m) for x in row))
        out.append(row[ids[p + 1]] - lse)
    return list(ids), out


def reference_top(golden, i, p, k):
    _, (rows, vocab), logits = golden[f"logits_{i}"]
    row = logits[p * vocab:(p + 1) * vocab]
    return sorted(range(vocab), key=lambda t: (-row[t], t))[:k]


def ppl(logprobs):
    return math.exp(-math.fsum(logprobs) / len(logprobs))


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
    golden = read_safetensors(MODELS[name] / "golden.safetensors")
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
    prompts = sorted(int(k.rsplit("_", 1)[1]) for k in golden if k.startswith("input_ids_"))
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
    golden = read_safetensors(MODELS["sluice-mini-moe"] / "golden.safetensors")
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
    prompts = sorted(int(k.rsplit("_", 1)[1]) for k in golden if k.startswith("input_ids_"))
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
