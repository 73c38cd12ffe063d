#!/usr/bin/env python3
"""Aggregated vs disaggregated serving at a fixed request rate, same GPU(s), same calls (issue 21).

Model: Llama-3-8B shapes with dummy weights by default (bench/configs/llama3-8b,
--load-format dummy). Prompts are token ids, so the tokenizer only has to decode every id: a
byte-level BPE sized to the config's vocab_size is written beside a copy of the config.

Two runs over the same Poisson arrival times (seeded) and the same prompts (--prompt-tokens random
ids), each request streaming --output-tokens tokens with ignore_eos:
  1. aggregated: `sluice serve --device cuda`;
  2. disaggregated: `sluice router` + 1 prefill + 1 decode, both `--device cuda` (on one GPU each
     takes --gpu-memory-utilization; --gpus 0,1 gives each its own).
Per request: TTFT (send -> first token) and every inter-token latency (ITL: gap between
consecutive streamed tokens). Reported: TTFT and ITL p50/p99, output tokens/s, and goodput =
requests/s that meet both SLOs, TTFT <= --slo-ttft and mean ITL (time per output token) <=
--slo-itl (the definition of DistServe, Zhong et al., OSDI 2024). The PNG shows every ITL
sample over time, both runs: prefill steps interleaved with decode show as ITL spikes in the
aggregated run.

Usage: python3 bench/disagg_serving_bench.py [--config bench/configs/llama3-8b] [--rate 6]
         [--duration 40] [--prompt-tokens 1024] [--output-tokens 256] [--gpus 0,1]
         [--out bench/results/disagg_serving_h200.json] [--plot ...png]
$SLUICE_BIN picks the binary (default build/bin/sluice).
"""
import argparse
import concurrent.futures
import http.client
import json
import os
import pathlib
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))
import sluice_cluster  # noqa: E402
from sluice_cluster import Cluster, Serve  # noqa: E402


def bytes_to_unicode():
    """GPT-2's byte -> printable character table (the ByteLevel pre-tokenizer's alphabet)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + \
        list(range(0xAE, 0xFF + 1))
    chars, n = keep[:], 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(keep, chars)}


def write_tokenizer(path, vocab_size):
    """A byte-level BPE with exactly vocab_size tokens: the 256 byte symbols, then 2- and 3-symbol
    merges of printable ASCII (a token id's text is all this bench needs)."""
    alphabet = list(bytes_to_unicode().values())
    vocab = {s: i for i, s in enumerate(alphabet)}
    merges = []
    printable = [chr(c) for c in range(ord("!"), ord("~") + 1)]
    pairs = [a + b for a in printable for b in printable]
    for p in pairs:
        if len(vocab) == vocab_size:
            break
        vocab[p] = len(vocab)
        merges.append(f"{p[0]} {p[1]}")
    for p in pairs:
        for c in printable:
            if len(vocab) == vocab_size:
                break
            vocab[p + c] = len(vocab)
            merges.append(f"{p} {c}")
    if len(vocab) != vocab_size:
        raise ValueError(f"cannot build a vocabulary of {vocab_size}")
    tok = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "vocab": vocab, "merges": merges},
    }
    path.write_text(json.dumps(tok))


def model_folder(config_dir):
    d = pathlib.Path(tempfile.mkdtemp(prefix="sluice-serving-bench-")) / config_dir.name
    d.mkdir()
    shutil.copy(config_dir / "config.json", d / "config.json")
    vocab = json.loads((d / "config.json").read_text())["vocab_size"]
    write_tokenizer(d / "tokenizer.json", vocab)
    return d


def stream_one(url, model, prompt, max_tokens, t0):
    """One streamed completion: (send time, [token arrival times]) relative to t0."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=600)
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens,
                       "temperature": 0, "ignore_eos": True, "stream": True})
    sent = time.perf_counter() - t0
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300]!r}")
    arrivals = []
    for raw in resp:
        line = raw.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if "error" in chunk:
            raise RuntimeError(f"stream error after {len(arrivals)} tokens: {chunk['error']}")
        if chunk.get("choices"):
            arrivals.append(time.perf_counter() - t0)
    conn.close()
    return sent, arrivals


def pct(values, q):
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def run_load(url, model, prompts, arrivals, max_tokens):
    t0 = time.perf_counter()
    results = [None] * len(prompts)

    def fire(i):
        delay = arrivals[i] - (time.perf_counter() - t0)
        if delay > 0:
            time.sleep(delay)
        try:
            results[i] = stream_one(url, model, prompts[i], max_tokens, t0)
        except Exception as e:  # a failed request is counted, not fatal
            results[i] = e

    with concurrent.futures.ThreadPoolExecutor(max(8, len(prompts))) as pool:
        list(pool.map(fire, range(len(prompts))))
    return results, time.perf_counter() - t0


def summarize(results, wall, slo_ttft, slo_itl):
    ok = [r for r in results if not isinstance(r, Exception) and r[1]]
    ttft = [r[1][0] - r[0] for r in ok]
    itl_samples = []  # (time, gap)
    met, tokens = 0, 0
    for sent, arr in ok:
        gaps = [b - a for a, b in zip(arr, arr[1:])]
        itl_samples += list(zip(arr[1:], gaps))
        tokens += len(arr)
        tpot = statistics.mean(gaps) if gaps else 0.0
        if arr[0] - sent <= slo_ttft and tpot <= slo_itl:
            met += 1
    itl = [g for _, g in itl_samples]
    ms = lambda v: None if v is None else round(v * 1e3, 2)  # noqa: E731
    return {
        "requests": len(results), "completed": len(ok),
        "failed": [str(r)[:200] for r in results if isinstance(r, Exception)][:5],
        "wall_s": round(wall, 2),
        "ttft_ms": {"p50": ms(pct(ttft, 0.5)), "p99": ms(pct(ttft, 0.99))},
        "itl_ms": {"p50": ms(pct(itl, 0.5)), "p99": ms(pct(itl, 0.99)),
                   "max": ms(max(itl) if itl else None)},
        "output_tokens_per_s": round(tokens / wall, 1),
        "goodput_requests_per_s": round(met / wall, 3),
        "slo_met_fraction": round(met / max(1, len(results)), 3),
    }, itl_samples


def plot(samples, path, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for name, style in (("aggregated", "tab:red"), ("disaggregated", "tab:blue")):
        pts = samples.get(name, [])
        ax.scatter([t for t, _ in pts], [g * 1e3 for _, g in pts], s=2, alpha=0.4, c=style,
                   label=name)
    ax.set_yscale("log")
    ax.set_xlabel("time since the first request (s)")
    ax.set_ylabel("inter-token latency (ms)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(markerscale=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default=str(REPO / "bench" / "configs" / "llama3-8b"))
    ap.add_argument("--rate", type=float, default=6.0, help="requests per second (Poisson)")
    ap.add_argument("--duration", type=float, default=40.0, help="seconds of arrivals")
    ap.add_argument("--prompt-tokens", type=int, default=1024)
    ap.add_argument("--output-tokens", type=int, default=256)
    ap.add_argument("--slo-ttft", type=float, default=1.0, help="seconds")
    ap.add_argument("--slo-itl", type=float, default=0.050, help="seconds")
    ap.add_argument("--gpus", default="", help="e.g. 0,1: prefill on the first GPU, decode on "
                                               "the second (default: both share one)")
    ap.add_argument("--modes", default="aggregated,disaggregated")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: the same runs on the CPU engine (a smoke test of this script)")
    ap.add_argument("--worker-args", default="", help="extra flags for serve and the workers")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "disagg_serving_h200.json"))
    ap.add_argument("--plot", default="")
    args = ap.parse_args()

    model_dir = model_folder(pathlib.Path(args.config))
    cfg = json.loads((model_dir / "config.json").read_text())
    rng = random.Random(21)
    arrivals, t = [], 0.0
    while True:
        t += rng.expovariate(args.rate)
        if t > args.duration:
            break
        arrivals.append(t)
    prompts = [[rng.randrange(1000, cfg["vocab_size"] - 1000) for _ in range(args.prompt_tokens)]
               for _ in arrivals]
    extra = args.worker_args.split()
    common = ["--device", args.device, "--load-format", "dummy",
              "--max-model-len", str(args.prompt_tokens + args.output_tokens + 16), *extra]
    report = {"benchmark": "disagg_serving", "config": args.config,
              "model_type": cfg.get("model_type"), "rate_rps": args.rate,
              "duration_s": args.duration, "prompt_tokens": args.prompt_tokens,
              "output_tokens": args.output_tokens,
              "slo": {"ttft_s": args.slo_ttft, "itl_s": args.slo_itl,
                      "goodput": "requests/s with TTFT <= slo_ttft and mean ITL <= slo_itl"},
              "gpus": args.gpus, "runs": {}}
    samples = {}
    for mode in args.modes.split(","):
        if mode == "aggregated":
            mem = ["--gpu-memory-utilization", "0.85"] if args.device == "cuda" else []
            server = Serve(model_dir, args=[*common, *mem])
        else:
            gpus = [g for g in args.gpus.split(",") if g]
            if gpus:
                env_start = sluice_cluster.Proc.start

                def start(proc, _orig=env_start):
                    os.environ["CUDA_VISIBLE_DEVICES"] = (
                        gpus[0] if proc.name.startswith("prefill") else gpus[-1])
                    try:
                        _orig(proc)
                    finally:
                        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
                sluice_cluster.Proc.start = start
            share = "0.85" if len(gpus) > 1 else "0.42"
            mem = ["--gpu-memory-utilization", share] if args.device == "cuda" else []
            server = Cluster(1, 1, worker_args=[*common, *mem],
                             model_dir=model_dir)
        try:
            with urllib_open(server.url + "/v1/models") as r:
                name = json.loads(r.read())["data"][0]["id"]
            # Warm-up: graphs and allocations outside the timed load.
            run_load(server.url, name, prompts[:4], [0.0] * 4, 8)
            results, wall = run_load(server.url, name, prompts, arrivals, args.output_tokens)
        finally:
            server.stop()
        summary, samples[mode] = summarize(results, wall, args.slo_ttft, args.slo_itl)
        report["runs"][mode] = summary
        print(f"{mode}: {json.dumps(summary)}", flush=True)
    pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    plot_path = args.plot or str(pathlib.Path(args.out).with_suffix(".png"))
    plot(samples, plot_path,
         f"{pathlib.Path(args.config).name} (dummy weights), {args.rate:g} req/s, "
         f"{args.prompt_tokens} in / {args.output_tokens} out")
    failed = sum(r["requests"] - r["completed"] for r in report["runs"].values())
    sys.exit(1 if failed else 0)


def urllib_open(url):
    import urllib.request
    return urllib.request.urlopen(url, timeout=30)


if __name__ == "__main__":
    main()
