#!/usr/bin/env python3
"""Fair prefill: TTFT of short prompts under a mixed load of long and short prompts on one
prefill worker, before (fcfs, no step time budget) and after (shortest_prefill_first with aging
and the per-step time budget), in one run.

For each configuration, starts on loopback `sluice router` with one prefill and one decode
worker (the embedded sluice-mini-moe; every prompt goes through the prefill worker) with that
configuration's worker flags, then:
  1. warm-up: a few long and short requests (the engines fit their step cost model);
  2. unloaded: --unloaded short requests one after another, nothing else running;
  3. mixed: --long-clients clients each send long prompts back to back while one client sends
     --short-requests short prompts, one every --short-interval-s seconds (open loop: each is
     sent on schedule, whether or not the previous one finished).
Prompts are random token ids (/v1/completions, a different prompt per request, so no prefix
cache hits), max_tokens 2, streamed; TTFT is measured client-side, from sending the request to
the first streamed token.

The issue's bound: the p99 TTFT of short requests under the mixed load <= 2 x their unloaded
TTFT (p50) + one step budget. `bound_ms` and `meets_bound` report it per configuration (for
"before" the step budget of "after" is used: it has none of its own).

Output: bench/results/fair_prefill.json (per configuration: unloaded p50/p99, mixed short
p50/p99, long TTFT p50/p99, long prompts per second, the ratios mixed/unloaded, and
after/before) and bench/results/fair_prefill.png (short TTFT distributions).

    .venv/bin/python bench/fair_prefill_bench.py [--long-tokens 1500] [--short-tokens 5]
        [--long-clients 2] [--short-requests 60] [--short-interval-s 0.25]
        [--configs before,after] [--out bench/results/fair_prefill.json]

A moderate load (one long prompt in flight, the issue's bound; the integration test
tests/integration/test_fair_prefill_cluster.py asserts it):

    .venv/bin/python bench/fair_prefill_bench.py --long-clients 1 --short-interval-s 0.3 \
        --short-requests 40 --configs after --out bench/results/fair_prefill_moderate.json
"""

import argparse
import asyncio
import json
import os
import pathlib
import platform
import random
import re
import subprocess
import sys
import time

import httpx

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))
from sluice_cluster import MODEL_NAME, Cluster, sluice_bin  # noqa: E402

VOCAB = 8192
CONFIGS = {
    "before": ["--scheduling-policy", "fcfs", "--step-time-budget-ms", "0"],
    "after": [],  # the defaults: shortest_prefill_first, aging, --step-time-budget-ms
}


def percentile(xs, p):
    xs = sorted(xs)
    if not xs:
        return None
    k = (len(xs) - 1) * p / 100.0
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def prompt(rng, n):
    return [rng.randrange(3, VOCAB) for _ in range(n)]


async def ttft(client, url, tokens, ids=None):
    """Seconds to the first streamed token; ids (a dict) gets the engine request id -> (TTFT,
    the wall-clock time it was sent)."""
    body = {"model": MODEL_NAME, "prompt": tokens, "max_tokens": 2, "temperature": 0,
            "stream": True}
    sent = time.time()
    start = time.perf_counter()
    first = None
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread()).decode()[:300]}")
        async for line in r.aiter_lines():
            if first is None and line.startswith("data: {"):
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    raise RuntimeError(chunk["error"])
                first = time.perf_counter() - start
                if ids is not None:
                    ids[chunk["id"] + "-0"] = (first, sent)  # engine id: response id + choice
    if first is None:
        raise RuntimeError("stream ended without a token")
    return first


STEP_LINE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3})\] .* step (\{.*\})$")


def read_steps(log_path):
    """The prefill worker's --log-steps lines: [(end unix seconds, step dict)]."""
    steps = []
    for line in pathlib.Path(log_path).read_text(errors="replace").splitlines():
        m = STEP_LINE.match(line)
        if not m:
            continue
        end = time.mktime(time.strptime(m.group(1)[:19], "%Y-%m-%d %H:%M:%S")) + \
            float(m.group(1)[19:])
        steps.append((end, json.loads(m.group(2))))
    return steps


def step_composition(steps, short_ids, long_tokens):
    """Where each mixed-load short request's TTFT went on the prefill worker: its wait from
    the moment the client sent it to its own step (`wait_ms`; `engine_wait_ms` is the part
    spent in the scheduler's queue, which does not count the step running when the request
    reached the engine), split into the steps it waited behind (their measured and predicted
    ms, their long-prompt tokens), and its own step (ms, rows, long tokens in it); the rest of
    its TTFT is `outside_prefill_ms` (router, HTTP, the first token's way back). Rows:
    [request id, prompt tokens, new tokens, computed before, samples, waited ms]."""
    per_short = []
    for idx, (end, st) in enumerate(steps):
        for row in st["rows"]:
            rid, prompt, q, c, samples, waited = row
            if rid not in short_ids or not samples:
                continue
            first, sent = short_ids[rid]
            start = end - st["ms"] / 1e3
            behind = [s for e, s in steps[:idx] if e > sent]
            per_short.append({
                "id": rid, "ttft_ms": first * 1e3, "wait_ms": (start - sent) * 1e3,
                "engine_wait_ms": waited,
                "own_step_ms": st["ms"], "own_step_pred_ms": st["pred_ms"],
                "own_step_long_tokens": sum(r[2] for r in st["rows"] if r[1] >= long_tokens),
                "own_step_rows": len(st["rows"]),
                "steps_behind": len(behind),
                "steps_behind_ms": [s["ms"] for s in behind],
                "steps_behind_pred_ms": [s["pred_ms"] for s in behind],
                "steps_behind_long_tokens": [sum(r[2] for r in s["rows"] if r[1] >= long_tokens)
                                             for s in behind],
                "outside_prefill_ms": (first - (end - sent)) * 1e3,
            })
    per_short.sort(key=lambda r: r["ttft_ms"])
    if not per_short:
        return {}
    # The mixed phase's long-chunk steps (the warm-up's ran before the cost model was fitted).
    mixed_from = min(sent for _, sent in short_ids.values())
    long_steps = [s for e, s in steps
                  if e >= mixed_from and any(r[1] >= long_tokens for r in s["rows"])]
    over = [s for s in long_steps if s["budget_ms"] and s["ms"] > s["budget_ms"]]
    def pct(key, p):
        return percentile([r[key] for r in per_short], p)
    return {
        "n": len(per_short),
        "wait_ms": {"p50": pct("wait_ms", 50), "p99": pct("wait_ms", 99)},
        "engine_wait_ms": {"p50": pct("engine_wait_ms", 50), "p99": pct("engine_wait_ms", 99)},
        "own_step_ms": {"p50": pct("own_step_ms", 50), "p99": pct("own_step_ms", 99)},
        "outside_prefill_ms": {"p50": pct("outside_prefill_ms", 50),
                               "p99": pct("outside_prefill_ms", 99)},
        "own_steps_with_long_tokens": sum(r["own_step_long_tokens"] > 0 for r in per_short),
        "steps_with_long_chunks": len(long_steps),
        "long_chunk_step_ms": {"p50": percentile([s["ms"] for s in long_steps], 50),
                               "p99": percentile([s["ms"] for s in long_steps], 99)},
        "long_chunk_steps_over_budget": len(over),
        "slowest_shorts": per_short[-3:],
    }


async def run_config(url, args, rng):
    limits = httpx.Limits(max_connections=args.long_clients + args.short_requests + 8)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        for _ in range(2):  # warm-up: fit the cost model on long and short steps
            await asyncio.gather(ttft(client, url, prompt(rng, args.long_tokens)),
                                 ttft(client, url, prompt(rng, args.short_tokens)))
        for _ in range(3):
            await ttft(client, url, prompt(rng, args.short_tokens))

        unloaded = [await ttft(client, url, prompt(rng, args.short_tokens))
                    for _ in range(args.unloaded)]

        stop = asyncio.Event()
        long_ttfts = []
        long_done = [0]

        async def long_client():
            while not stop.is_set():
                long_ttfts.append(await ttft(client, url, prompt(rng, args.long_tokens)))
                long_done[0] += 1

        longs = [asyncio.create_task(long_client()) for _ in range(args.long_clients)]
        await asyncio.sleep(args.long_head_start_s)  # the prefill queue fills first
        t0 = time.perf_counter()
        shorts = []
        short_ids = {}
        for i in range(args.short_requests):
            shorts.append(asyncio.create_task(
                ttft(client, url, prompt(rng, args.short_tokens), short_ids)))
            await asyncio.sleep(args.short_interval_s)
        short_ttfts = await asyncio.gather(*shorts)
        elapsed = time.perf_counter() - t0
        n_long = long_done[0]
        stop.set()
        await asyncio.gather(*longs)
    return {
        "unloaded_short_ttft_ms": {"p50": percentile(unloaded, 50) * 1e3,
                                   "p99": percentile(unloaded, 99) * 1e3,
                                   "n": len(unloaded)},
        "mixed_short_ttft_ms": {"p50": percentile(short_ttfts, 50) * 1e3,
                                "p99": percentile(short_ttfts, 99) * 1e3,
                                "max": max(short_ttfts) * 1e3, "n": len(short_ttfts)},
        "mixed_long_ttft_ms": {"p50": percentile(long_ttfts, 50) * 1e3,
                               "p99": percentile(long_ttfts, 99) * 1e3, "n": len(long_ttfts)},
        "long_prompts_per_s": n_long / elapsed,
        "short_ttfts_ms": [x * 1e3 for x in short_ttfts],
    }, short_ids


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--long-tokens", type=int, default=1500)
    ap.add_argument("--short-tokens", type=int, default=5)
    ap.add_argument("--long-clients", type=int, default=2)
    ap.add_argument("--short-requests", type=int, default=60)
    ap.add_argument("--short-interval-s", type=float, default=0.25)
    ap.add_argument("--long-head-start-s", type=float, default=2.0)
    ap.add_argument("--unloaded", type=int, default=20)
    ap.add_argument("--step-time-budget-ms", type=float, default=None,
                    help="'after' step budget (default: the binary's default)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--configs", default="before,after",
                    help="which configurations to run (comma-separated: before, after)")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "fair_prefill.json"))
    args = ap.parse_args()

    help_text = subprocess.run([sluice_bin(), "prefill", "--help"], capture_output=True,
                               text=True).stdout
    budget_ms = args.step_time_budget_ms
    if budget_ms is None:
        for line in help_text.splitlines():  # "--step-time-budget-ms FLOAT:... =250"
            if "--step-time-budget-ms" in line and "=" in line:
                budget_ms = float(line.split("=", 1)[1].split()[0])
    after_flags = list(CONFIGS["after"])
    if args.step_time_budget_ms is not None:
        after_flags += ["--step-time-budget-ms", str(args.step_time_budget_ms)]

    results = {}
    configs = [(n, f) for n, f in (("before", CONFIGS["before"]), ("after", after_flags))
               if n in args.configs.split(",")]
    for name, flags in configs:
        rng = random.Random(args.seed)
        load0 = os.getloadavg()[0]
        cluster = Cluster(1, 1, worker_args=flags + ["--log-steps"])
        try:
            r, short_ids = asyncio.run(run_config(cluster.url, args, rng))
        finally:
            cluster.stop()
        r["steps"] = step_composition(read_steps(cluster.workers["prefill-0"].log_path),
                                      short_ids, args.long_tokens)
        r["worker_flags"] = flags
        r["prefill_log"] = str(cluster.workers["prefill-0"].log_path)
        r["load_avg_1m"] = [load0, os.getloadavg()[0]]
        unl = r["unloaded_short_ttft_ms"]["p50"]
        r["bound_ms"] = 2 * unl + (budget_ms or 0.0)
        r["meets_bound"] = r["mixed_short_ttft_ms"]["p99"] <= r["bound_ms"]
        r["mixed_over_unloaded_p50"] = r["mixed_short_ttft_ms"]["p50"] / unl
        r["mixed_over_unloaded_p99"] = r["mixed_short_ttft_ms"]["p99"] / unl
        results[name] = r
        print(f"{name}: unloaded p50 {unl:.0f} ms; mixed short p50 "
              f"{r['mixed_short_ttft_ms']['p50']:.0f} p99 {r['mixed_short_ttft_ms']['p99']:.0f} ms"
              f" (bound {r['bound_ms']:.0f}); long p50 {r['mixed_long_ttft_ms']['p50']:.0f} ms; "
              f"{r['long_prompts_per_s']:.2f} long prompts/s", flush=True)
        st = r["steps"]
        if st:
            print(f"  prefill worker: short wait (sent to own step) p50 "
                  f"{st['wait_ms']['p50']:.0f} p99 {st['wait_ms']['p99']:.0f} ms (in the "
                  f"scheduler's queue p50 {st['engine_wait_ms']['p50']:.0f} p99 "
                  f"{st['engine_wait_ms']['p99']:.0f}), own step p50 "
                  f"{st['own_step_ms']['p50']:.0f} p99 {st['own_step_ms']['p99']:.0f} ms, "
                  f"outside prefill p50 {st['outside_prefill_ms']['p50']:.0f} p99 "
                  f"{st['outside_prefill_ms']['p99']:.0f} ms; {st['own_steps_with_long_tokens']}"
                  f" short steps carried long tokens; long-chunk steps p50 "
                  f"{st['long_chunk_step_ms']['p50']:.0f} p99 {st['long_chunk_step_ms']['p99']:.0f}"
                  f" ms, {st['long_chunk_steps_over_budget']} of {st['steps_with_long_chunks']} "
                  "over the budget", flush=True)
            for w in st["slowest_shorts"]:
                print(f"    slow short {w['ttft_ms']:.0f} ms: wait {w['wait_ms']:.0f} "
                      f"(queued {w['engine_wait_ms']:.0f}) behind"
                      f" {w['steps_behind_ms']} ms (pred {w['steps_behind_pred_ms']}, long tokens"
                      f" {w['steps_behind_long_tokens']}); own step {w['own_step_ms']:.0f} ms "
                      f"({w['own_step_rows']} rows); outside {w['outside_prefill_ms']:.0f} ms",
                      flush=True)

    summary = {"step_time_budget_ms": budget_ms}
    for name, r in results.items():  # the figure: p99 short TTFT against its bound
        summary[name] = {"unloaded_short_p50_ms": r["unloaded_short_ttft_ms"]["p50"],
                         "mixed_short_p99_ms": r["mixed_short_ttft_ms"]["p99"],
                         "bound_ms": r["bound_ms"], "meets_bound": r["meets_bound"],
                         "p99_over_bound": r["mixed_short_ttft_ms"]["p99"] / r["bound_ms"]}
    if "before" in results and "after" in results:
        b, a = results["before"], results["after"]
        summary.update({
            "short_p50_after_over_before":
                a["mixed_short_ttft_ms"]["p50"] / b["mixed_short_ttft_ms"]["p50"],
            "short_p99_after_over_before":
                a["mixed_short_ttft_ms"]["p99"] / b["mixed_short_ttft_ms"]["p99"],
            "long_p50_after_over_before":
                a["mixed_long_ttft_ms"]["p50"] / b["mixed_long_ttft_ms"]["p50"],
            "long_throughput_after_over_before":
                a["long_prompts_per_s"] / b["long_prompts_per_s"],
        })
    try:
        commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = ""
    doc = {
        "bench": "fair_prefill",
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "commit": commit, "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
        "params": {k: v for k, v in vars(args).items() if k != "out"},
        "summary": summary,
        "configs": results,
    }
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(summary, indent=1))

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, color in (("before", "tab:red"), ("after", "tab:blue")):
        if name not in results:
            continue
        xs = sorted(results[name]["short_ttfts_ms"])
        ys = [(i + 1) / len(xs) for i in range(len(xs))]
        ax.step(xs, ys, where="post", color=color,
                label=f"{name}: {' '.join(results[name]['worker_flags']) or 'defaults'}")
        ax.axvline(results[name]["unloaded_short_ttft_ms"]["p50"], color=color, ls=":", lw=1)
    ax.axvline(results[configs[-1][0]]["bound_ms"], color="k", ls="--", lw=1,
               label="bound: 2x unloaded + step budget")
    ax.set_xscale("log")
    ax.set_xlabel(f"TTFT of {args.short_tokens}-token prompts under mixed load (ms)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(f"{args.long_clients} clients of {args.long_tokens}-token prompts, 1 prefill worker")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=120)


if __name__ == "__main__":
    main()
