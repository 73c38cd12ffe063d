#!/usr/bin/env python3
"""Perplexity of a text set through a server's OpenAI API (sluice serve, the router, or any
server that returns prompt logprobs for echo + logprobs, e.g. vLLM).

Each text goes to /v1/completions with echo=true, logprobs=0, max_tokens=1 (as lm-eval's
local-completions scores text); the logprobs of the prompt's tokens after the first are summed.

    bench/ppl.py --url http://127.0.0.1:8000 texts.txt [--concurrency 8] [--json]
    bench/ppl.py --url http://127.0.0.1:8000 texts.txt --tokenizer MODEL_DIR
                 [--max-length N] [--stride S]
    bench/ppl.py --url http://127.0.0.1:8000 --reference MODEL_DIR [--rel-tol 1e-4] [--json]

texts.txt: one text per line, or JSON lines with a "text" field. Prints the perplexity, the
scored token count and the wall time (or one JSON object with --json).

--tokenizer tokenizes the texts here (with the server's tokenizer.json) and sends token ids, in
strided windows when a text is longer than --max-length tokens (default: the server's
max_model_len - 1), each later window scoring --stride new tokens (default: half a window), as
`sluice eval ppl --tokenizer` does; a text within one window scores as without --tokenizer.

--reference scores the golden prompts of MODEL_DIR/golden.safetensors (input_ids_i with the
reference logits_i of the model's float32 forward, as tests/fixtures and models/ store them)
as token ids, and compares each prompt's perplexity and every token's logprob with what the
reference logits give (log_softmax in float64). Exit status 1 when a perplexity differs by more
than --rel-tol (relative) or a prompt token comes back different.
"""

import argparse
import concurrent.futures
import json
import math
import pathlib
import sys
import time
import urllib.error
import urllib.request

# The golden reference logprobs, as the tests read them.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests" / "testing"))
from golden_logprobs import golden_prompts, ppl, read_golden, reference_logprobs  # noqa: E402


def post(url, path, body, timeout=600):
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def get(url, path, timeout=60):
    with urllib.request.urlopen(url + path, timeout=timeout) as r:
        return json.loads(r.read())


def read_texts(path):
    texts = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            if line.startswith("{"):
                try:
                    texts.append(json.loads(line)["text"])
                    continue
                except (ValueError, KeyError):
                    pass
            texts.append(line.rstrip("\n"))
    return texts


def score(url, model, text, add_special_tokens=True):
    """Returns (nll in nats, scored tokens) of one text."""
    r = post(url, "/v1/completions",
             {"model": model, "prompt": text, "max_tokens": 1, "echo": True, "logprobs": 0,
              "temperature": 0, "add_special_tokens": add_special_tokens})
    logprobs = r["choices"][0]["logprobs"]["token_logprobs"]
    num_prompt = r["usage"]["prompt_tokens"]
    scored = logprobs[1:num_prompt]  # the first is null; the last one is the generated token's
    return -sum(scored), len(scored)


def plan_windows(num_tokens, max_length, stride):
    """Strided windows (begin, end, first_scored) as services/serve/ppl_windows.h: at most
    max_length tokens each, every token after the first scored once, later windows scoring
    `stride` new tokens after max_length - stride tokens of context."""
    if num_tokens < 2:
        return []
    scored_to = min(num_tokens, max_length)
    windows = [(0, scored_to, 1)]
    while scored_to < num_tokens:
        end = min(scored_to + stride, num_tokens)
        windows.append((end - max_length, end, scored_to))
        scored_to = end
    return windows


def score_window(url, model, ids, skip):
    """(nll, scored tokens) of token prompt `ids` whose first `skip` tokens are context."""
    r = post(url, "/v1/completions",
             {"model": model, "prompt": ids, "max_tokens": 1, "echo": True, "logprobs": 0,
              "temperature": 0})
    scored = r["choices"][0]["logprobs"]["token_logprobs"][skip:len(ids)]
    return -math.fsum(scored), len(scored)


def perplexity(url, texts, model=None, concurrency=8, add_special_tokens=True, tokenizer=None,
               max_length=None, stride=None):
    """With a `tokenizers` Tokenizer (the server's tokenizer.json): texts tokenized here and
    scored as token ids in windows of max_length tokens (default: max_model_len - 1)."""
    models = get(url, "/v1/models")["data"]
    if model is None:
        model = models[0]["id"]
    if tokenizer is None:
        with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
            results = list(pool.map(lambda t: score(url, model, t, add_special_tokens), texts))
        nll = sum(r[0] for r in results)
        tokens = sum(r[1] for r in results)
        return {"model": model, "num_texts": len(texts), "num_tokens": tokens, "nll": nll,
                "ppl": math.exp(nll / tokens) if tokens else 0.0}
    if max_length is None:
        max_length = next(m for m in models if m["id"] == model)["max_model_len"] - 1
    stride = stride or max_length // 2
    if not 1 <= stride < max_length:
        raise ValueError(f"--stride must be in [1, {max_length - 1}], got {stride}")
    jobs = []
    for text in texts:
        ids = tokenizer.encode(text, add_special_tokens=add_special_tokens).ids
        jobs += [(ids[b:e], f - b) for b, e, f in plan_windows(len(ids), max_length, stride)]
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(lambda j: score_window(url, model, *j), jobs))
    nll = math.fsum(r[0] for r in results)
    tokens = sum(r[1] for r in results)
    return {"model": model, "num_texts": len(texts), "num_tokens": tokens, "nll": nll,
            "ppl": math.exp(nll / tokens) if tokens else 0.0, "num_windows": len(jobs),
            "max_length": max_length, "stride": stride}


def score_ids(url, model, ids):
    """The served logprobs of prompt ids[1:] (ids sent as a token prompt, nothing added)."""
    r = post(url, "/v1/completions",
             {"model": model, "prompt": ids, "max_tokens": 1, "echo": True, "logprobs": 0,
              "temperature": 0, "return_tokens_as_token_ids": True})
    lp = r["choices"][0]["logprobs"]
    got_ids = [int(t.split(":", 1)[1]) for t in lp["tokens"][:len(ids)]]
    if got_ids != ids or r["usage"]["prompt_tokens"] != len(ids) or \
            lp["token_logprobs"][0] is not None:
        raise ValueError(f"the echoed prompt differs: {got_ids} != {ids}")
    return lp["token_logprobs"][1:len(ids)]


def compare_with_reference(url, model_dir, model=None, rel_tol=1e-4, concurrency=8):
    """Served vs reference perplexity of each golden prompt of model_dir and of all of them."""
    golden = read_golden(pathlib.Path(model_dir) / "golden.safetensors")
    if model is None:
        model = get(url, "/v1/models")["data"][0]["id"]
    prompts = golden_prompts(golden)
    refs = [reference_logprobs(golden, i) for i in prompts]
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        served = list(pool.map(lambda ref: score_ids(url, model, ref[0]), refs))
    rows, all_got, all_want = [], [], []
    for i, (ids, want), got in zip(prompts, refs, served):
        all_got += got
        all_want += want
        rows.append({"prompt": i, "num_tokens": len(want), "ppl": ppl(got),
                     "reference_ppl": ppl(want),
                     "max_abs_logprob_diff": max(abs(a - b) for a, b in zip(got, want))})
    result = {"model": model, "num_tokens": len(all_want), "ppl": ppl(all_got),
              "reference_ppl": ppl(all_want), "prompts": rows, "rel_tol": rel_tol}
    result["rel_err"] = max(abs(r["ppl"] / r["reference_ppl"] - 1)
                            for r in rows + [result])
    result["ok"] = result["rel_err"] <= rel_tol
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file", nargs="?")
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--model")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--no-special-tokens", action="store_true", help="no BOS before each text")
    ap.add_argument("--tokenizer", metavar="MODEL_DIR",
                    help="tokenize here with MODEL_DIR/tokenizer.json (the server's) and score "
                         "texts longer than --max-length in strided windows")
    ap.add_argument("--max-length", type=int, help="with --tokenizer: tokens per window "
                                                   "(default: max_model_len - 1)")
    ap.add_argument("--stride", type=int, help="with --tokenizer: tokens each later window "
                                               "scores (default: max-length / 2)")
    ap.add_argument("--reference", metavar="MODEL_DIR",
                    help="score MODEL_DIR/golden.safetensors' prompts against its logits")
    ap.add_argument("--rel-tol", type=float, default=1e-4,
                    help="with --reference: the largest relative perplexity error accepted")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if (args.file is None) == (args.reference is None):
        ap.error("give either FILE or --reference MODEL_DIR")
    if args.tokenizer is None and (args.max_length or args.stride):
        ap.error("--max-length and --stride need --tokenizer")
    tokenizer = None
    if args.tokenizer is not None:
        import tokenizers  # tests/requirements.txt
        tokenizer = tokenizers.Tokenizer.from_file(str(pathlib.Path(args.tokenizer) /
                                                       "tokenizer.json"))
    url = args.url.rstrip("/")
    start = time.monotonic()
    try:
        if args.reference is not None:
            result = compare_with_reference(url, args.reference, args.model, args.rel_tol,
                                            args.concurrency)
        else:
            result = perplexity(url, read_texts(args.file), args.model, args.concurrency,
                                not args.no_special_tokens, tokenizer, args.max_length,
                                args.stride)
    except urllib.error.HTTPError as e:
        print(f"ppl.py: HTTP {e.code}: {e.read().decode(errors='replace')}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as e:
        print(f"ppl.py: {e}", file=sys.stderr)
        return 1
    result["seconds"] = time.monotonic() - start
    if args.json:
        print(json.dumps(result))
    elif args.reference is not None:
        for r in result["prompts"]:
            print(f"prompt {r['prompt']}: {r['num_tokens']:4d} tokens  ppl {r['ppl']:.6f}  "
                  f"reference {r['reference_ppl']:.6f}  "
                  f"max |dlogprob| {r['max_abs_logprob_diff']:.2e}")
        print(f"{result['model']}: ppl {result['ppl']:.6f} reference "
              f"{result['reference_ppl']:.6f} over {result['num_tokens']} tokens; largest "
              f"relative error {result['rel_err']:.2e} "
              f"({'within' if result['ok'] else 'BEYOND'} {args.rel_tol:g})")
    else:
        print(f"{result['model']}: ppl {result['ppl']:.4f} over {result['num_tokens']} tokens "
              f"of {result['num_texts']} texts ({result['seconds']:.1f} s)")
    return 0 if result.get("ok", True) else 1


if __name__ == "__main__":
    sys.exit(main())
