#!/usr/bin/env python3
"""Recomputes per 100 requests of a disaggregated cluster under load, by logged reason.

Starts `sluice router` + prefill + decode workers on loopback (tests/integration/sluice_cluster.py),
sends --requests chats with long prompts from --concurrency clients at once (prefill steps grow
long on a CPU), and reads the decode workers' sluice_decode_transfers_recomputed_total and
sluice_decode_recomputes_total{reason} (absent in builds before the reasons were counted), their
KV transfer results and their preemptions (sluice_preemptions_total{cause}: prompts recomputed
because their blocks went to other sequences). Every recompute is also logged by the worker as
`recompute {json}` with its cause (services/common/recompute_log.h). Prints one JSON object;
--out also writes it.

  SLUICE_BIN=build/bin/sluice python3 bench/recompute_load.py --requests 43 --concurrency 43
"""

import argparse
import concurrent.futures
import json
import os
import re
import sys
import time
from pathlib import Path

import openai

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "integration"))
from sluice_cluster import MODEL_NAME, Cluster, sum_samples  # noqa: E402


def messages(i, words):
    body = " ".join(f"stone{(i * 13 + j) % 211}" for j in range(words))
    return [{"role": "user", "content": f"Request {i}: {body}. Name one stone."}]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=43)
    ap.add_argument("--concurrency", type=int, default=43)
    ap.add_argument("--prompt-words", type=int, default=300)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--num-prefill", type=int, default=1)
    ap.add_argument("--num-decode", type=int, default=1)
    ap.add_argument("--out", help="write the JSON here too")
    args = ap.parse_args()

    cluster = Cluster(num_prefill=args.num_prefill, num_decode=args.num_decode)
    try:
        client = openai.OpenAI(base_url=cluster.url + "/v1", api_key="x", timeout=600,
                               max_retries=0)

        def one(i):
            try:
                r = client.chat.completions.create(model=MODEL_NAME, temperature=0,
                                                   max_tokens=args.max_tokens,
                                                   messages=messages(i, args.prompt_words))
            except openai.APIStatusError as e:
                return "error", e.status_code
            return "ok", r.usage.prompt_tokens

        start = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
            results = list(pool.map(one, range(args.requests)))
        prompts = [v for kind, v in results if kind == "ok"] or [0]
        errors = {}
        for kind, v in results:
            if kind == "error":
                errors[str(v)] = errors.get(str(v), 0) + 1
        seconds = time.monotonic() - start
        decode_names = [n for n in cluster.workers if n.startswith("decode")]
        texts = {n: cluster.worker_metrics_text(n) for n in decode_names}
        recomputed = sum(sum_samples(t, "sluice_decode_transfers_recomputed_total")
                         for t in texts.values())
        reasons = {}
        for t in texts.values():
            for reason, value in re.findall(
                    r'^sluice_decode_recomputes_total\{reason="([^"]+)"\} (\S+)$', t, re.M):
                reasons[reason] = reasons.get(reason, 0) + float(value)
        transfers_ok = sum(sum_samples(t, 'sluice_kv_transfers_total{result="ok"}')
                           for t in texts.values())
        # The other way a decode worker recomputes a prompt: a preemption (its KV blocks were
        # taken for other sequences' tokens), whatever its transfer did.
        preemptions = sum(sum_samples(t, "sluice_preemptions_total") for t in texts.values())
        preemption_causes = {}
        for t in texts.values():
            for cause, value in re.findall(
                    r'^sluice_preemptions_total\{cause="([^"]+)"\} (\S+)$', t, re.M):
                preemption_causes[cause] = preemption_causes.get(cause, 0) + float(value)
        # Requests prefilled on their decode worker move no KV (the router's choice).
        prefills = {where: cluster.metric(f'sluice_router_prefills_total{{where="{where}"}}')
                    for where in ("remote", "local")}
        result = {
            "binary": os.path.abspath(os.environ.get("SLUICE_BIN", "build/bin/sluice")),
            "requests": args.requests, "concurrency": args.concurrency,
            "mean_prompt_tokens": sum(prompts) / len(prompts), "max_tokens": args.max_tokens,
            "num_prefill": args.num_prefill, "num_decode": args.num_decode,
            "seconds": round(seconds, 2),
            "errors_by_http_status": errors,
            "router_prefills": prefills,
            "kv_transfers_ok": transfers_ok,
            "recomputed": recomputed,
            "recomputes_per_100_requests": 100.0 * recomputed / args.requests,
            "recomputes_by_reason": reasons,
            "unexplained_recomputes": recomputed - sum(reasons.values()),
            "decode_preemptions": preemptions,
            "decode_preemptions_per_100_requests": 100.0 * preemptions / args.requests,
            "decode_preemptions_by_cause": preemption_causes,
            "load_average_1m": os.getloadavg()[0],
        }
    finally:
        cluster.stop()
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
