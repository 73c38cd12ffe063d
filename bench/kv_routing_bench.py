#!/usr/bin/env python3
"""KV-aware routing against round-robin on a multi-turn chat workload, same run.

Workload (deterministic): NUM_SYSTEMS shared system prompts; NUM_CONVS conversations, each using
one of them; every conversation runs NUM_TURNS turns, its history growing by the user message
and the greedy assistant reply of each turn. Turn t of every conversation is sent before turn
t + 1 of any, with CONCURRENCY requests in flight, so the policies see interleaved conversations.

For each policy (--routing-policy kv, then round_robin) a fresh cluster is started (router +
--prefill prefill workers + --decode decode workers, tests/integration/sluice_cluster.py: cold
caches both times), warmed up with unique prompts (not counted), then the workload runs.
Measured from the API: prefix hit rate = sum(usage.prompt_tokens_details.cached_tokens) /
sum(usage.prompt_tokens); prefill tokens computed = sum(prompt_tokens - cached_tokens); TTFT =
time from sending the streaming request to its first content chunk (mean, p50, p90).

Usage: .venv/bin/python bench/kv_routing_bench.py [--out bench/results/kv_routing.json]
SLUICE_BIN selects the binary (default build/bin/sluice).
"""

import argparse
import concurrent.futures
import json
import os
import pathlib
import platform
import random
import statistics
import sys
import time

import openai

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))
from sluice_cluster import MODEL_NAME, Cluster, http_get  # noqa: E402

WORDS = ("river stone lantern harbor meadow copper violet orchard signal winter canyon ember "
         "falcon garden island jasmine kettle ladder marble nectar oyster pepper quartz "
         "saddle thistle umber velvet willow yarrow zephyr anchor bramble cinder dune").split()


def text(rng, n_words):
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def workload(args):
    rng = random.Random(args.seed)
    systems = [f"You are assistant #{i}. Policy: " + text(rng, args.system_words)
               for i in range(args.num_systems)]
    convs = []
    for c in range(args.num_convs):
        turns = [f"Turn {t} of chat {c}: " + text(rng, args.user_words)
                 for t in range(args.num_turns)]
        convs.append({"system": systems[c % args.num_systems], "turns": turns})
    return convs


def one_request(client, messages, max_tokens):
    start = time.perf_counter()
    ttft = None
    pieces = []
    usage = None
    stream = client.chat.completions.create(
        model=MODEL_NAME, messages=messages, temperature=0, max_tokens=max_tokens, stream=True,
        stream_options={"include_usage": True})
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            if ttft is None:
                ttft = time.perf_counter() - start
            pieces.append(chunk.choices[0].delta.content)
        if chunk.usage is not None:
            usage = chunk.usage
    if ttft is None:  # an empty reply: its first token still ended the prefill
        ttft = time.perf_counter() - start
    cached = 0
    if usage.prompt_tokens_details is not None:
        cached = usage.prompt_tokens_details.cached_tokens or 0
    return {"ttft_s": ttft, "text": "".join(pieces), "prompt_tokens": usage.prompt_tokens,
            "cached_tokens": cached}


def percentile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def run_policy(policy, args, convs):
    cluster = Cluster(args.prefill, args.decode, router_args=["--routing-policy", policy])
    try:
        client = openai.OpenAI(base_url=cluster.url + "/v1", api_key="x", timeout=300,
                               max_retries=0)
        for i in range(2 * (args.prefill + args.decode)):  # warm-up, unique prompts
            one_request(client, [{"role": "user", "content": f"warm up {policy} {i}"}], 2)
        histories = [[{"role": "system", "content": c["system"]}] for c in convs]
        records = []
        wall_start = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
            for t in range(args.num_turns):
                for c, conv in enumerate(convs):
                    histories[c].append({"role": "user", "content": conv["turns"][t]})
                futures = [pool.submit(one_request, client, list(histories[c]), args.max_tokens)
                           for c in range(len(convs))]
                for c, future in enumerate(futures):
                    r = future.result()
                    r["turn"] = t
                    records.append(r)
                    histories[c].append({"role": "assistant", "content": r["text"]})
        wall = time.perf_counter() - wall_start
        workers = json.loads(http_get(cluster.url + "/v1/workers")[1])["data"]
    finally:
        cluster.stop()
    prompt = sum(r["prompt_tokens"] for r in records)
    cached = sum(r["cached_tokens"] for r in records)
    ttfts = [r["ttft_s"] for r in records]
    later = [r for r in records if r["turn"] > 0]
    return {
        "policy": policy,
        "requests": len(records),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "prefix_hit_rate": cached / prompt if prompt else 0.0,
        "prefill_tokens_computed": prompt - cached,
        "ttft_mean_ms": 1000 * statistics.mean(ttfts),
        "ttft_p50_ms": 1000 * percentile(ttfts, 0.5),
        "ttft_p90_ms": 1000 * percentile(ttfts, 0.9),
        "turns_after_first_hit_rate": (sum(r["cached_tokens"] for r in later) /
                                       max(1, sum(r["prompt_tokens"] for r in later))),
        "wall_s": wall,
        "picks_per_worker": {w["id"]: w["picked"] for w in workers},
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prefill", type=int, default=4)
    parser.add_argument("--decode", type=int, default=1)
    parser.add_argument("--num-systems", type=int, default=4)
    parser.add_argument("--num-convs", type=int, default=16)
    parser.add_argument("--num-turns", type=int, default=4)
    parser.add_argument("--system-words", type=int, default=160)
    parser.add_argument("--user-words", type=int, default=24)
    parser.add_argument("--max-tokens", type=int, default=12)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--policies", default="kv,round_robin")
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "kv_routing.json"))
    args = parser.parse_args()
    convs = workload(args)
    results = [run_policy(p, args, convs) for p in args.policies.split(",")]
    report = {
        "bench": "kv_routing",
        "command": " ".join(["bench/kv_routing_bench.py", *sys.argv[1:]]),
        "model": MODEL_NAME,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "config": {k: v for k, v in vars(args).items() if k != "out"},
        "results": results,
    }
    pathlib.Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    for r in results:
        print(f"{r['policy']:>12}: hit rate {r['prefix_hit_rate']:.3f}, prefill tokens computed "
              f"{r['prefill_tokens_computed']}, TTFT mean {r['ttft_mean_ms']:.1f} ms "
              f"(p50 {r['ttft_p50_ms']:.1f}, p90 {r['ttft_p90_ms']:.1f}), wall {r['wall_s']:.1f} s")


if __name__ == "__main__":
    main()
