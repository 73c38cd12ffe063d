#!/usr/bin/env python3
"""Disaggregated CUDA serving equals `sluice serve --device cuda` (issue 21), on a GPU machine.

For one model: `sluice serve --device cuda` answers N prompts greedily (the reference); then a
router + 1 prefill + 1 decode worker, both `--device cuda` on this host (KV GPU to GPU over UCX
cuda_ipc; --gpus gives each worker its own GPU), answer the same N prompts with N requests in
flight. Every completion's token ids must equal the reference's; afterwards both workers' free
KV blocks must be back at their idle baseline (sluice_kv_cache_free_blocks on /metrics).

Usage: .venv/bin/python bench/gpu_disagg_equality.py --model DIR [--mode pull|push]
         [--requests 200] [--gpus 0,1] [--worker-args "..."] [--out FILE.json]
Exit 0 when everything is equal and the blocks returned, 1 otherwise. SLUICE_BIN picks the binary.
"""
import argparse
import concurrent.futures
import json
import os
import pathlib
import random
import sys
import time
import urllib.request

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))
import sluice_cluster  # noqa: E402
from sluice_cluster import Cluster, Serve, sum_samples  # noqa: E402


def pin_workers_to_gpus(prefill_gpu, decode_gpu):
    """Starts each worker process of later Clusters with its own CUDA_VISIBLE_DEVICES."""
    def start(proc):
        env = dict(os.environ)
        if proc.name.startswith("prefill"):
            env["CUDA_VISIBLE_DEVICES"] = prefill_gpu
        elif proc.name.startswith("decode"):
            env["CUDA_VISIBLE_DEVICES"] = decode_gpu
        proc.log = open(proc.log_path, "ab")
        proc.proc = sluice_cluster.subprocess.Popen(proc.args, stdout=proc.log, stderr=proc.log,
                                                    env=env)
    sluice_cluster.Proc.start = start


def completion(url, model, prompt, max_tokens):
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens,
                       "temperature": 0, "logprobs": 1}).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        out = json.loads(r.read())
    choice = out["choices"][0]
    return {"text": choice["text"], "tokens": choice["logprobs"]["tokens"],
            "finish_reason": choice["finish_reason"]}


def run_all(url, model, prompts, max_tokens, concurrency):
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(lambda p: completion(url, model, p, max_tokens), prompts))


def served_name(url):
    with urllib.request.urlopen(url + "/v1/models", timeout=30) as r:
        return json.loads(r.read())["data"][0]["id"]


def free_blocks(cluster, name):
    return sum_samples(cluster.worker_metrics_text(name), "sluice_kv_cache_free_blocks")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--mode", default="pull", choices=["pull", "push"])
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--gpus", default="", help="e.g. 0,1: prefill on the first, decode on the "
                                               "second (default: both share the visible GPU)")
    ap.add_argument("--gpu-memory-utilization", default="0.4")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: the same check on the CPU engine (a smoke test of this script)")
    ap.add_argument("--worker-args", default="", help="extra flags for serve and both workers")
    ap.add_argument("--out", default="")
    args = ap.parse_args()

    extra = args.worker_args.split()
    device = (["--device", "cuda", "--gpu-memory-utilization", args.gpu_memory_utilization]
              if args.device == "cuda" else [])
    rng = random.Random(21)
    words = "river stone lantern harbor meadow copper violet orchard signal winter".split()
    prompts = [f"Request {i}: " + " ".join(rng.choice(words) for _ in range(rng.randint(4, 120)))
               for i in range(args.requests)]

    serve = Serve(pathlib.Path(args.model), args=[*device, *extra])
    try:
        name = served_name(serve.url)
        reference = run_all(serve.url, name, prompts, args.max_tokens, args.requests)
    finally:
        serve.stop()

    gpus = [g for g in args.gpus.split(",") if g]
    if gpus:  # one GPU per worker
        pin_workers_to_gpus(gpus[0], gpus[-1])
    worker_args = [*device, "--kv-transfer-mode", args.mode, *extra]
    cluster = Cluster(1, 1, worker_args=worker_args, model_dir=pathlib.Path(args.model))
    report = {"model": args.model, "mode": args.mode, "requests": args.requests, "gpus": gpus}
    try:
        baseline = {w: free_blocks(cluster, w) for w in ("prefill-0", "decode-0")}
        start = time.time()
        got = run_all(cluster.url, name, prompts, args.max_tokens, args.requests)
        report["seconds"] = round(time.time() - start, 2)
        mismatches = [i for i, (a, b) in enumerate(zip(reference, got))
                      if a["tokens"] != b["tokens"] or a["finish_reason"] != b["finish_reason"]]
        report["mismatches"] = mismatches[:20]
        report["num_mismatches"] = len(mismatches)
        deadline = time.time() + 30
        while True:
            after = {w: free_blocks(cluster, w) for w in baseline}
            if after == baseline or time.time() > deadline:
                break
            time.sleep(0.5)
        report["free_blocks_baseline"] = baseline
        report["free_blocks_after"] = after
        text = cluster.worker_metrics_text("decode-0")
        report["kv_transfers_ok"] = sum_samples(text, 'sluice_kv_transfers_total{result="ok"}')
    finally:
        cluster.stop()
    ok = report["num_mismatches"] == 0 and report["free_blocks_after"] == baseline
    report["ok"] = ok
    print(json.dumps(report, indent=2))
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
