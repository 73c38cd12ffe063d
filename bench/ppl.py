#!/usr/bin/env python3
"""Perplexity of a text set through a server's OpenAI API (sluice serve, the router, or any
server that returns prompt logprobs for echo + logprobs, e.g. vLLM).

Each text goes to /v1/completions with echo=true, logprobs=0, max_tokens=1 (as lm-eval's
local-completions scores text); the logprobs of the prompt's tokens after the first are summed.

    bench/ppl.py --url http://127.0.0.1:8000 texts.txt [--concurrency 8] [--json]

texts.txt: one text per line, or JSON lines with a "text" field. Prints the perplexity, the
scored token count and the wall time (or one JSON object with --json).
"""

import argparse
import concurrent.futures
import json
import math
import sys
import time
import urllib.request


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


def perplexity(url, texts, model=None, concurrency=8, add_special_tokens=True):
    if model is None:
        model = get(url, "/v1/models")["data"][0]["id"]
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(lambda t: score(url, model, t, add_special_tokens), texts))
    nll = sum(r[0] for r in results)
    tokens = sum(r[1] for r in results)
    return {"model": model, "num_texts": len(texts), "num_tokens": tokens, "nll": nll,
            "ppl": math.exp(nll / tokens) if tokens else 0.0}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file")
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--model")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--no-special-tokens", action="store_true", help="no BOS before each text")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    start = time.monotonic()
    result = perplexity(args.url.rstrip("/"), read_texts(args.file), args.model,
                        args.concurrency, not args.no_special_tokens)
    result["seconds"] = time.monotonic() - start
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{result['model']}: ppl {result['ppl']:.4f} over {result['num_tokens']} tokens "
              f"of {result['num_texts']} texts ({result['seconds']:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
