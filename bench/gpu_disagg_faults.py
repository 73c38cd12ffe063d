#!/usr/bin/env python3
"""Faults on GPU workers (issue 21): kill -9 of decode mid-stream and of prefill mid-transfer.

Standard library only, so it runs on the GPU machine beside a device bundle (SLUICE_BIN).
For one model, with --worker-args (default `--device cuda --gpu-memory-utilization 0.2`) on
every worker:
  1. decode kill: router + 1 prefill + 2 decode; --streams greedy streams (ignore_eos, --tokens
     each); once every stream has >= 10 tokens the decode worker with the most assigned requests
     gets SIGKILL, and is restarted; a round counts only if the router migrated streams. Repeated --rounds times. Every stream must complete with all
     its tokens (the router migrates it); its text is compared with `sluice serve` on the same
     device (counted, not required: a CUDA re-prefill of the generated tokens runs other shapes
     than decode did, so near-tied greedy tokens may flip; on the CPU engine they are equal).
  2. prefill kill mid-transfer: router + 2 prefill + 1 decode whose KV transfers are each held
     --transfer-delay-ms (the test hook --test-transfer-delay-ms): --streams requests are sent,
     and the prefill worker that answered most of them is killed while decode pulls. Every
     request must end (200 or a clean JSON error) within --deadline-s.
After each part: free KV blocks back at baseline on the surviving workers, and new requests are
served (one per part, which must complete).

Usage: python3 bench/gpu_disagg_faults.py --model DIR [--worker-args "..."] [--rounds 3]
         [--streams 4] [--tokens N] [--out FILE.json]
--tokens defaults to the model's context less 64 (max_position_embeddings, at most 1800): a GPU
decodes llama-tiny's 448 tokens in 0.3 s, before the kill lands, and a round without a
migration tests nothing.
Exit 0 when every check holds, 1 otherwise. `--worker-args "--device cpu"` runs it on the CPU.
"""
import argparse
import concurrent.futures
import http.client
import json
import pathlib
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))
from sluice_cluster import Cluster, Serve, http_get, wait_until  # noqa: E402


def prompt(i):
    return f"Request {i}: describe {i % 5 + 2} kinds of trees and where they grow."


def stream(url, model, i, tokens, counts, timeout):
    """Streams /v1/completions for prompt i; returns (text, finish_reason, error or None)."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    body = json.dumps({"model": model, "prompt": prompt(i), "max_tokens": tokens,
                       "temperature": 0, "ignore_eos": True, "stream": True})
    text, finish = "", None
    try:
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            return text, None, f"HTTP {resp.status}: {resp.read()[:200]!r}"
        for raw in resp:
            line = raw.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                return text, None, f"stream error: {chunk['error']}"
            for c in chunk.get("choices", []):
                text += c.get("text") or ""
                counts[i] = counts.get(i, 0) + 1
                finish = c.get("finish_reason") or finish
        return text, finish, None
    except (OSError, http.client.HTTPException) as e:
        return text, None, f"{type(e).__name__}: {e}"
    finally:
        conn.close()


def model_name(url):
    return json.loads(http_get(url + "/v1/models")[1])["data"][0]["id"]


def blocks_at_baseline(cluster, names):
    for name in names:
        wait_until(lambda: cluster.worker_metric(name, "sluice_kv_cache_free_blocks") ==
                   cluster.worker_metric(name, "sluice_kv_cache_blocks"), 30, f"{name} blocks free")


def restart(cluster, name, num_prefill, num_decode):
    cluster.workers[name].stop()
    cluster.workers[name].start()
    health = cluster.metrics_urls[name].replace("/metrics", "/health")
    wait_until(lambda: http_get(health)[0] == 200, 180, f"{name} up again")
    address = cluster.workers[name].args[cluster.workers[name].args.index("--listen") + 1]
    wait_until(lambda: any(w["address"] == address and not w["suspect"]
                           for w in cluster.workers_json()), 60, f"{name} registered")
    cluster.wait_registered(num_prefill, num_decode)


def busiest(cluster, role, count):
    assigned = {w["address"]: w["assigned"] for w in cluster.workers_json() if w["role"] == role}
    names = [f"{role}-{k}" for k in range(count)]
    return max(names, key=lambda n: assigned.get(
        cluster.workers[n].args[cluster.workers[n].args.index("--listen") + 1], -1))


def new_request_served(cluster, name):
    text, finish, error = stream(cluster.url, name, 99, 8, {}, 120)
    return error is None and finish == "length"


def decode_kill(args, worker_args, reference):
    cluster = Cluster(1, 2, worker_args=worker_args, model_dir=args.model)
    report = {"rounds": [], "ok": True}
    try:
        name = model_name(cluster.url)
        for r in range(args.rounds):
            counts = {}
            migrations_before = cluster.metric("sluice_router_migrations_total")
            t0 = time.monotonic()
            with concurrent.futures.ThreadPoolExecutor(args.streams) as pool:
                futures = [pool.submit(stream, cluster.url, name, i, args.tokens, counts,
                                       args.deadline_s) for i in range(args.streams)]
                wait_until(lambda: all(counts.get(i, 0) >= 10 or futures[i].done()
                                       for i in range(args.streams)), 120, ">= 10 tokens each")
                victim = busiest(cluster, "decode", 2)
                cluster.workers[victim].kill9()
                results = [f.result(timeout=args.deadline_s + 30) for f in futures]
            seconds = time.monotonic() - t0
            complete = sum(e is None and f == "length" for _, f, e in results)
            equal = sum(t == reference[i] for i, (t, _, _) in enumerate(results))
            survivor = "decode-1" if victim == "decode-0" else "decode-0"
            blocks_at_baseline(cluster, ["prefill-0", survivor])
            served = new_request_served(cluster, name)
            restart(cluster, victim, 1, 2)
            migrated = cluster.metric("sluice_router_migrations_total") - migrations_before
            # migrated == 0: every stream ended before the kill, so the round tested nothing.
            round_ok = (complete == args.streams and seconds <= args.deadline_s and served and
                        migrated > 0)
            report["rounds"].append({"victim": victim, "complete": complete, "equal_text": equal,
                                     "migrated": migrated,
                                     "seconds": round(seconds, 2), "new_request_served": served,
                                     "errors": [e for _, _, e in results if e]})
            report["ok"] &= round_ok
            print(f"decode kill round {r}: {complete}/{args.streams} complete, {migrated:.0f} migrated, "
                  f"{equal} equal to serve, {seconds:.1f} s, new request served: {served}", flush=True)
        report["migrations"] = cluster.metric("sluice_router_migrations_total")
    finally:
        cluster.stop()
    return report


def prefill_kill(args, worker_args):
    delay = ["--test-transfer-delay-ms", str(args.transfer_delay_ms)]
    cluster = Cluster(2, 1, worker_args=worker_args, role_args={"decode": delay},
                      model_dir=args.model)
    report = {"ok": True}
    try:
        name = model_name(cluster.url)
        t0 = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(args.streams) as pool:
            futures = [pool.submit(stream, cluster.url, name, i, args.tokens, {}, args.deadline_s)
                       for i in range(args.streams)]
            # Prefill has answered (the first tokens streamed) while decode still holds the pulls.
            time.sleep(args.transfer_delay_ms / 2000)
            victim = busiest(cluster, "prefill", 2)
            cluster.workers[victim].kill9()
            results = [f.result(timeout=args.deadline_s + 30) for f in futures]
        seconds = time.monotonic() - t0
        survivor = "prefill-1" if victim == "prefill-0" else "prefill-0"
        blocks_at_baseline(cluster, [survivor, "decode-0"])
        served = new_request_served(cluster, name)
        complete = sum(e is None and f == "length" for _, f, e in results)
        errors = [e for _, _, e in results if e]
        # A clean end: all tokens, or an error the client was told about (HTTP status / SSE error).
        clean = all(e is None or e.startswith(("HTTP ", "stream error")) for e in errors)
        report.update({"victim": victim, "complete": complete, "errors": errors,
                       "seconds": round(seconds, 2), "new_request_served": served,
                       "ok": clean and seconds <= args.deadline_s and served})
        print(f"prefill kill: {complete}/{args.streams} complete, {len(errors)} clean errors, "
              f"{seconds:.1f} s, new request served: {served}", flush=True)
    finally:
        cluster.stop()
    return report


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--worker-args", default="--device cuda --gpu-memory-utilization 0.2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=0)
    ap.add_argument("--transfer-delay-ms", type=int, default=3000)
    ap.add_argument("--deadline-s", type=float, default=120.0)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    worker_args = args.worker_args.split()
    if args.tokens <= 0:
        config = json.loads((pathlib.Path(args.model) / "config.json").read_text())
        args.tokens = min(1800, int(config.get("max_position_embeddings", 364)) - 64)

    serve = Serve(args.model, args=worker_args)
    try:
        name = model_name(serve.url)
        reference = [stream(serve.url, name, i, args.tokens, {}, 120)[0]
                     for i in range(args.streams)]
    finally:
        serve.stop()
    report = {"benchmark": "gpu_disagg_faults", "model": args.model,
              "worker_args": args.worker_args,
              "decode_kill": decode_kill(args, worker_args, reference),
              "prefill_kill": prefill_kill(args, worker_args)}
    report["ok"] = report["decode_kill"]["ok"] and report["prefill_kill"]["ok"]
    print(json.dumps({"ok": report["ok"]}))
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    sys.exit(0 if report["ok"] else 1)


if __name__ == "__main__":
    main()
