"""Prompt logprobs and perplexity through the router (1 prefill + 1 decode worker), for
sluice-mini-moe and the fixture models with stored reference logits.

The router runs with --min-remote-prefill-tokens 32, so the golden prompts of 5 and 17 tokens
are prefilled (and scored) on the decode worker and those of 64 and 150 tokens on the prefill
worker, whose prompt logprobs travel in PrefillResponse. On both paths every prompt token's
logprob equals log_softmax of the reference logits (float32 forward of transformers), and the
perplexity they give is within 1e-4 relative, through echo + logprobs, vLLM's prompt_logprobs,
a streamed echo, `sluice eval ppl` and bench/ppl.py (with and without --reference)."""

import json
import math
import subprocess
import sys
import tempfile
import urllib.request

import openai
import pytest

from golden_logprobs import (golden_prompts, log_sum_exp, logit_rows, ppl, read_golden,
                             top_tokens)
from sluice_cluster import MODEL_DIR, REPO, Cluster, sluice_bin

FIXTURES = REPO.parent / "shared" / "fixtures"
MODELS = {
    "sluice-mini-moe": MODEL_DIR,
    "llama-tiny": FIXTURES / "llama-tiny",
    "qwen3-hybrid-tiny": FIXTURES / "qwen3-hybrid-tiny",
    "deepseek-v3-tiny": FIXTURES / "deepseek-v3-tiny",
}
MIN_REMOTE_PREFILL = 32
PPL_REL_TOL = 1e-4  # the bound for perplexity
LOGPROB_ABS_TOL = 2e-4  # per token: fp32 engine vs the fp32 reference, log-sum-exp in float64


TIE = 1e-5  # logits closer than this may rank either way in the engine


def reference(golden, i):
    """(ids, per position p: the logprob of prompt token p + 1, the 4 most likely tokens, and
    the range of ranks prompt token p + 1 may have given near ties)."""
    ids, rows = logit_rows(golden, i)
    logprobs, order, ranks = [], [], []
    for p, row in enumerate(rows[:-1]):
        x = row[ids[p + 1]]
        logprobs.append(x - log_sum_exp(row))
        order.append(top_tokens(row, 4))
        ranks.append((1 + sum(v > x + TIE for v in row), 1 + sum(v > x - TIE for v in row)))
    return ids, logprobs, (order, ranks)


def token_ids(tokens):
    return [int(t.split(":", 1)[1]) for t in tokens]


def prefills(cluster):
    with urllib.request.urlopen(cluster.url + "/metrics", timeout=30) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("sluice_router_prefills_total{where="):
            out[line.split('"')[1]] = float(line.split()[-1])
    return out


@pytest.fixture(scope="module", params=list(MODELS))
def served(request):
    name = request.param
    c = Cluster(num_prefill=1, num_decode=1, model_dir=MODELS[name],
                router_args=["--min-remote-prefill-tokens", str(MIN_REMOTE_PREFILL)])
    client = openai.OpenAI(base_url=c.url + "/v1", api_key="x", max_retries=0, timeout=300)
    golden = read_golden(MODELS[name] / "golden.safetensors")
    prompts = golden_prompts(golden)
    refs = [reference(golden, i) for i in prompts]
    # Both prefill paths are exercised.
    assert any(len(r[0]) < MIN_REMOTE_PREFILL for r in refs)
    assert any(len(r[0]) >= MIN_REMOTE_PREFILL for r in refs)
    try:
        yield name, c, client, refs
    finally:
        c.stop()


def check_prompt_logprobs(name, ids, want, ranking, tokens, logprobs, top):
    """Completions echo logprobs (tokens as ids, 2 alternatives) of prompt `ids` against the
    reference: the same tokens, the first without a logprob, each logprob within
    LOGPROB_ABS_TOL, the perplexity within PPL_REL_TOL, the best alternative one of the
    reference's 2 most likely tokens."""
    order, _ = ranking
    assert token_ids(tokens[:len(ids)]) == ids
    assert logprobs[0] is None and top[0] is None
    got = logprobs[1:len(ids)]
    worst = max(abs(a - b) for a, b in zip(got, want))
    assert worst <= LOGPROB_ABS_TOL, (name, len(ids), worst)
    assert math.isclose(ppl(got), ppl(want), rel_tol=PPL_REL_TOL), (name, ppl(got), ppl(want))
    for p in range(1, len(ids)):
        assert f"token_id:{ids[p]}" in top[p]
        others = {int(t.split(":", 1)[1]): v for t, v in top[p].items()}
        others.pop(ids[p])
        best = max(others, key=lambda t: others[t])
        assert best in order[p - 1][:2], (name, p, top[p], order[p - 1])
    return got


def test_echo_logprobs_equal_reference_on_both_prefill_paths(served):
    name, cluster, client, refs = served
    before = prefills(cluster)
    for ids, want, ranking in refs:
        r = client.completions.create(model=name, prompt=ids, max_tokens=1, echo=True,
                                      logprobs=2, temperature=0,
                                      extra_body={"return_tokens_as_token_ids": True})
        lp = r.choices[0].logprobs
        check_prompt_logprobs(name, ids, want, ranking, lp.tokens, lp.token_logprobs,
                              lp.top_logprobs)
        assert len(lp.tokens) == len(ids) + 1  # the prompt, then the generated token
        assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == 1
    after = prefills(cluster)
    num_short = sum(len(ids) < MIN_REMOTE_PREFILL for ids, _, _ in refs)
    assert after["local"] - before["local"] == num_short
    assert after["remote"] - before["remote"] == len(refs) - num_short
    # All golden prompts in one request (lm-eval batches them): one choice per prompt.
    r = client.completions.create(model=name, prompt=[ids for ids, _, _ in refs], max_tokens=1,
                                  echo=True, logprobs=2, temperature=0,
                                  extra_body={"return_tokens_as_token_ids": True})
    assert sorted(c.index for c in r.choices) == list(range(len(refs)))
    for c in r.choices:
        ids, want, ranking = refs[c.index]
        check_prompt_logprobs(name, ids, want, ranking, c.logprobs.tokens,
                              c.logprobs.token_logprobs, c.logprobs.top_logprobs)


def test_prompt_logprobs_field_through_the_router(served):
    name, _, client, refs = served
    for ids, want, ranking in refs:
        r = client.completions.create(model=name, prompt=ids, max_tokens=2, temperature=0,
                                      extra_body={"prompt_logprobs": 3})
        pl = r.choices[0].model_extra["prompt_logprobs"]
        assert pl[0] is None and len(pl) == len(ids)
        got = []
        for p in range(1, len(ids)):
            entry = pl[p]
            mine = entry[str(ids[p])]
            got.append(mine["logprob"])
            # vLLM's rank: 1 + the number of tokens more likely than the prompt token.
            low, high = ranking[1][p - 1]
            assert low <= mine["rank"] <= high, (name, p, mine, low, high)
            # The 3 most likely tokens, ranked 1..3, plus the prompt token if it is not one.
            others = {int(k): v for k, v in entry.items() if int(k) != ids[p]}
            assert sorted(v["rank"] for v in entry.values())[:3] == [1, 2, 3]
            assert len(entry) == (3 if mine["rank"] <= 3 else 4)
            best = min(others, key=lambda t: others[t]["rank"])
            assert best in ranking[0][p - 1][:2], (name, p, entry, ranking[0][p - 1])
        assert max(abs(a - b) for a, b in zip(got, want)) <= LOGPROB_ABS_TOL
        assert math.isclose(ppl(got), ppl(want), rel_tol=PPL_REL_TOL)
        assert r.choices[0].text != "" or r.choices[0].finish_reason == "stop"
    # Chat: vLLM puts prompt_logprobs on the response, one entry per rendered prompt token.
    c = client.chat.completions.create(model=name, max_tokens=1,
                                       messages=[{"role": "user", "content": "In the beginning"}],
                                       extra_body={"prompt_logprobs": 0})
    pl = c.model_extra["prompt_logprobs"]
    assert pl[0] is None and len(pl) == c.usage.prompt_tokens
    assert all(len(e) == 1 and next(iter(e.values()))["logprob"] <= 0 for e in pl[1:])


def test_streamed_echo_logprobs_through_the_router(served):
    name, _, client, refs = served
    ids, want, ranking = refs[-1]  # remote prefill
    chunks = list(client.completions.create(model=name, prompt=ids, max_tokens=3, echo=True,
                                            logprobs=2, temperature=0, stream=True,
                                            extra_body={"return_tokens_as_token_ids": True,
                                                        "ignore_eos": True}))
    tokens, logprobs, top = [], [], []
    for c in chunks:
        if c.choices and c.choices[0].logprobs:
            tokens += c.choices[0].logprobs.tokens
            logprobs += c.choices[0].logprobs.token_logprobs
            top += c.choices[0].logprobs.top_logprobs
    assert len(tokens) == len(ids) + 3
    check_prompt_logprobs(name, ids, want, ranking, tokens, logprobs, top)
    full = client.completions.create(model=name, prompt=ids, max_tokens=3, echo=True,
                                     logprobs=2, temperature=0,
                                     extra_body={"return_tokens_as_token_ids": True,
                                                 "ignore_eos": True})
    assert tokens == full.choices[0].logprobs.tokens
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full.choices[0].text


def test_eval_ppl_and_bench_script_through_the_router(served):
    """The golden prompts as text (they re-encode to the same ids, BOS included):
    `sluice eval ppl`, bench/ppl.py and bench/ppl.py --reference give the reference perplexity."""
    import tokenizers
    name, cluster, _, refs = served
    tok = tokenizers.Tokenizer.from_file(str(MODELS[name] / "tokenizer.json"))
    want = [lp for _, lps, _ in refs for lp in lps]
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for ids, _, _ in refs:
            text = tok.decode(ids, skip_special_tokens=False)
            assert tok.encode(text, add_special_tokens=False).ids == ids
            f.write(json.dumps({"text": text}) + "\n")
        path = f.name
    out = subprocess.run([sluice_bin(), "eval", "ppl", path, "--url", cluster.url,
                          "--no-special-tokens"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["model"] == name and result["num_texts"] == len(refs)
    assert result["num_tokens"] == len(want)
    assert [t["num_tokens"] for t in result["texts"]] == [len(r[1]) for r in refs]
    for t, (_, lps, _) in zip(result["texts"], refs):
        assert math.isclose(t["ppl"], ppl(lps), rel_tol=PPL_REL_TOL), (name, t, ppl(lps))
    assert math.isclose(result["ppl"], ppl(want), rel_tol=PPL_REL_TOL), (result, ppl(want))

    bench = REPO / "bench" / "ppl.py"
    b = subprocess.run([sys.executable, str(bench), path, "--url", cluster.url,
                        "--no-special-tokens", "--json"],
                       capture_output=True, text=True, timeout=300)
    assert b.returncode == 0, b.stderr
    b = json.loads(b.stdout)
    assert b["num_tokens"] == len(want)
    assert math.isclose(b["ppl"], result["ppl"], rel_tol=1e-9)

    ref = subprocess.run([sys.executable, str(bench), "--url", cluster.url, "--reference",
                          str(MODELS[name]), "--json"],
                         capture_output=True, text=True, timeout=300)
    assert ref.returncode == 0, ref.stderr
    ref = json.loads(ref.stdout)
    assert ref["ok"] and ref["rel_err"] <= PPL_REL_TOL
    assert ref["num_tokens"] == len(want)
    assert math.isclose(ref["reference_ppl"], ppl(want), rel_tol=1e-12)
    assert math.isclose(ref["ppl"], result["ppl"], rel_tol=PPL_REL_TOL)
    assert [r["num_tokens"] for r in ref["prompts"]] == [len(r[1]) for r in refs]
    # A tolerance the served numbers cannot meet fails the comparison (exit 1).
    strict = subprocess.run([sys.executable, str(bench), "--url", cluster.url, "--reference",
                             str(MODELS[name]), "--rel-tol", "0"],
                            capture_output=True, text=True, timeout=300)
    assert (strict.returncode == 1) == (ref["rel_err"] > 0), strict.stdout
    assert ("BEYOND" in strict.stdout) == (ref["rel_err"] > 0), strict.stdout


def test_eval_ppl_windows_through_the_router(served):
    """A text tokenized by `sluice eval ppl --tokenizer` and scored in strided windows of 255
    tokens (all prefilled on the prefill worker): every token after the first is scored once,
    and the perplexity equals the one the windows give when sent one by one."""
    import tokenizers
    name, cluster, client, _ = served
    tok = tokenizers.Tokenizer.from_file(str(MODELS[name] / "tokenizer.json"))
    golden = json.loads((FIXTURES / "tokenizer" / "tokenizer_golden.json").read_text())
    verses = [c["text"] for c in golden["cases"] if c["category"] == "kjv"]
    text = " ".join(verses[:next(n for n in range(len(verses))
                                 if len(tok.encode(" ".join(verses[:n])).ids) >= 600)])
    ids = tok.encode(text).ids
    max_length, stride = 255, 100
    assert 2 * max_length < len(ids) < 3 * max_length
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(text + "\n")
        path = f.name
    before = prefills(cluster)
    out = subprocess.run([sluice_bin(), "eval", "ppl", path, "--url", cluster.url,
                          "--tokenizer", str(MODELS[name]), "--max-length", str(max_length),
                          "--stride", str(stride)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    num_windows = 1 + -(-(len(ids) - max_length) // stride)
    assert result["num_windows"] == num_windows and result["num_tokens"] == len(ids) - 1
    assert prefills(cluster)["remote"] - before["remote"] == num_windows
    want, scored_to = [], 0
    while scored_to < len(ids):
        end = min(len(ids), max_length if scored_to == 0 else scored_to + stride)
        begin = max(0, end - max_length)
        r = client.completions.create(model=name, prompt=ids[begin:end], max_tokens=1,
                                      echo=True, logprobs=0, temperature=0)
        want += r.choices[0].logprobs.token_logprobs[max(scored_to, 1) - begin:end - begin]
        scored_to = end
    assert len(want) == len(ids) - 1
    assert math.isclose(result["ppl"], ppl(want), rel_tol=1e-6), (result["ppl"], ppl(want))


def test_max_tokens_zero_with_echo_through_the_router(served):
    """max_tokens 0 + echo: the prompt's logprobs only, on both prefill paths."""
    name, _, client, refs = served
    for ids, want, ranking in refs:
        r = client.completions.create(model=name, prompt=ids, max_tokens=0, echo=True,
                                      logprobs=2, temperature=0,
                                      extra_body={"return_tokens_as_token_ids": True})
        c = r.choices[0]
        assert len(c.logprobs.tokens) == len(ids) and c.finish_reason == "length"
        check_prompt_logprobs(name, ids, want, ranking, c.logprobs.tokens,
                              c.logprobs.token_logprobs, c.logprobs.top_logprobs)
        assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(ids), 0)
