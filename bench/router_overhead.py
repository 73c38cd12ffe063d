#!/usr/bin/env python3
"""Router overhead: the TTFT a client sees through `sluice router` (prefill/decode workers over
gRPC) against calling `sluice serve` directly, on the embedded model, in one run.

Starts, on loopback: `sluice serve`, and `sluice router --min-remote-prefill-tokens T` with one
prefill and one decode worker. Two prompt sets:
  - short chat prompts (< T tokens): the router skips remote prefill, so the path is
    client -> router -> decode worker (prefill on the decode worker) -> router -> client;
  - long chat prompts (>= T tokens): client -> router -> prefill worker (first token) -> client,
    with the decode worker reserving blocks and pulling the KV over UCX behind it.
Each set runs against both endpoints at each concurrency (1 and 64 streaming clients; each client
sends its requests one after another). TTFT is measured client-side: from sending the request
to receiving the first SSE chunk with non-empty content (httpx streaming, asyncio; the empty
role chunk that starts a chat stream does not count). Endpoints alternate per concurrency level
so both see the same machine state; idle processes take no CPU.

Output: bench/results/router_overhead.json — per (prompt set, concurrency): p50/p99 TTFT of
serve and router, the added p50/p99 (router - serve, ms) and the ratios router/serve.

    .venv/bin/python bench/router_overhead.py [--requests-c1 40] [--requests-per-client-c64 3]
"""

import argparse
import asyncio
import json
import os
import pathlib
import platform
import subprocess
import sys
import tempfile
import time

import httpx

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))
from sluice_cluster import (MODEL_DIR, MODEL_NAME, STARTUP_TIMEOUT_S, Proc, free_port,  # noqa
                            http_get, sluice_bin, wait_until)


def short_messages(i):
    return [{"role": "user", "content": f"Question {i}: name a color."}]


def long_messages(i):
    verse = ("In the beginning God created the heaven and the earth. And the earth was without "
             "form, and void; and darkness was upon the face of the deep. ")
    return [{"role": "user", "content": f"Passage {i}: {verse * 3} Summarize it."}]


async def one_request(client, url, messages, max_tokens):
    body = {"model": MODEL_NAME, "messages": messages, "temperature": 0,
            "max_tokens": max_tokens, "stream": True}
    start = time.perf_counter()
    ttft = None
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if ttft is None and line.startswith("data: {"):
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    raise RuntimeError(chunk["error"])
                choices = chunk.get("choices") or []
                if choices and choices[0].get("delta", {}).get("content"):
                    ttft = time.perf_counter() - start
    if ttft is None:
        raise RuntimeError("stream ended without content")
    return ttft


async def measure(url, make_messages, concurrency, per_client, max_tokens):
    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        async def client_loop(k):
            out = []
            for j in range(per_client):
                out.append(await one_request(client, url, make_messages(k * per_client + j),
                                             max_tokens))
            return out
        results = await asyncio.gather(*(client_loop(k) for k in range(concurrency)))
    return [t for r in results for t in r]


def percentile(values, q):
    """Nearest-rank percentile (q in [0, 100])."""
    values = sorted(values)
    rank = max(1, -(-len(values) * q // 100))
    return values[int(rank) - 1]


def start_serve(log_dir):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = Proc("serve", [sluice_bin(), "serve", "--model", str(MODEL_DIR), "--port", str(port)],
                log_dir)
    wait_until(lambda: http_get(url + "/health")[0] == 200, STARTUP_TIMEOUT_S, "serve /health")
    return url, [proc]


def start_router(log_dir, min_remote_prefill_tokens):
    binary = sluice_bin()
    port, grpc_port = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    procs = [Proc("router", [binary, "router", "--model", str(MODEL_DIR), "--port", str(port),
                             "--grpc-port", str(grpc_port), "--min-remote-prefill-tokens",
                             str(min_remote_prefill_tokens)], log_dir)]
    for role in ("prefill", "decode"):
        procs.append(Proc(role, [binary, role, "--model", str(MODEL_DIR), "--listen",
                                 f"127.0.0.1:{free_port()}", "--router",
                                 f"127.0.0.1:{grpc_port}"], log_dir))

    def ready():
        workers = json.loads(http_get(url + "/v1/workers")[1])["data"]
        return (len(workers) == 2 and http_get(url + "/health")[0] == 200)
    wait_until(ready, STARTUP_TIMEOUT_S, "router with 1 prefill + 1 decode")
    return url, procs


def router_prefill_counts(url):
    counts = {}
    for line in http_get(url + "/metrics")[1].splitlines():
        if line.startswith("sluice_router_prefills_total{"):
            where = line.split('where="')[1].split('"')[0]
            counts[where] = float(line.rsplit(" ", 1)[1])
    return counts


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests-c1", type=int, default=40)
    parser.add_argument("--requests-per-client-c64", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument("--min-remote-prefill-tokens", type=int, default=64)
    parser.add_argument("--output", default=str(REPO / "bench" / "results" /
                                                "router_overhead.json"))
    args = parser.parse_args()

    log_dir = tempfile.mkdtemp(prefix="sluice-router-overhead-")
    serve_url, serve_procs = start_serve(log_dir)
    router_url, router_procs = start_router(log_dir, args.min_remote_prefill_tokens)
    load_start = os.getloadavg()[0]
    rows = []
    try:
        sets = [("router->decode (prefill on decode worker)", short_messages),
                ("router->prefill->decode (remote prefill, KV over UCX)", long_messages)]
        for name, make in sets:
            for url in (serve_url, router_url):  # warm-up: connections, allocator, caches
                asyncio.run(measure(url, make, 4, 2, args.max_tokens))
            for concurrency, per_client in ((1, args.requests_c1),
                                            (64, args.requests_per_client_c64)):
                before = router_prefill_counts(router_url)
                serve_ttft = asyncio.run(measure(serve_url, make, concurrency, per_client,
                                                 args.max_tokens))
                router_ttft = asyncio.run(measure(router_url, make, concurrency, per_client,
                                                  args.max_tokens))
                after = router_prefill_counts(router_url)
                row = {"path": name, "concurrency": concurrency, "requests": len(router_ttft),
                       "router_prefills": {k: after[k] - before.get(k, 0) for k in after}}
                for label, values in (("serve", serve_ttft), ("router", router_ttft)):
                    row[f"{label}_ttft_p50_ms"] = round(percentile(values, 50) * 1e3, 2)
                    row[f"{label}_ttft_p99_ms"] = round(percentile(values, 99) * 1e3, 2)
                for q in ("p50", "p99"):
                    s, r = row[f"serve_ttft_{q}_ms"], row[f"router_ttft_{q}_ms"]
                    row[f"added_ttft_{q}_ms"] = round(r - s, 2)
                    row[f"ratio_{q}"] = round(r / s, 3)
                rows.append(row)
                print(f"{name:55s} c={concurrency:3d}  serve p50 {row['serve_ttft_p50_ms']:8.1f}"
                      f" p99 {row['serve_ttft_p99_ms']:8.1f} | router p50 "
                      f"{row['router_ttft_p50_ms']:8.1f} p99 {row['router_ttft_p99_ms']:8.1f} ms"
                      f" | ratio p50 {row['ratio_p50']:.2f} p99 {row['ratio_p99']:.2f}",
                      flush=True)
    finally:
        for proc in serve_procs + router_procs:
            proc.stop()
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    result = {
        "benchmark": "router_overhead",
        "model": MODEL_NAME,
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(),
                    "load_avg_1m_start": round(load_start, 2),
                    "load_avg_1m_end": round(os.getloadavg()[0], 2)},
        "git_commit": commit,
        "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "settings": {"max_tokens": args.max_tokens,
                     "min_remote_prefill_tokens": args.min_remote_prefill_tokens,
                     "requests_c1": args.requests_c1,
                     "requests_per_client_c64": args.requests_per_client_c64,
                     "ttft": "client-side, request sent -> first SSE chunk with content"},
        "rows": rows,
    }
    pathlib.Path(args.output).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
