#!/usr/bin/env python3
"""KV transfer throughput beside ucx_perftest on the same transport, and prefill->decode handover.

Transfer part, for each batch size (default 1, 4, 16, 64 MiB) and the same UCX_TLS, repeated
--repeats times (the machine is shared: the spread is part of the result):
  * kv_transfer_bench (transfer/kv_transfer_bench.cc): Sluice pull and push of the batch as
    256 KiB blocks in fragmented runs of 8 blocks, between two processes; per call p50/p99;
  * ucx_perftest -t ucp_get and -t ucp_put_bw (server + client on loopback, message size = batch),
    on the same memory (--memory cuda: device memory on both sides, perftest -m cuda).
Same call compared with same call: ratio_pull = Sluice pull / perftest ucp_get, ratio_push =
Sluice push / perftest ucp_put_bw, each taken within one repeat (back to back), then summarized
as median [min, max] over the repeats. GB/s = 1e9 bytes/s (ucx_perftest prints MB/s meaning
2^20 bytes/s; converted).

Handover part (--handover-requests > 0): a router + 1 prefill + 1 decode worker on this host
(tests/integration/sluice_cluster.py; --handover-model, default sluice-mini-moe; the CPU engine
unless --handover-worker-args says --device cuda) serve that many completions, per KV
transfer mode (--handover-modes: pull, push, layerwise). From the decode worker's histograms:
handover = prefill done -> decode's first output (sluice_kv_handover_seconds; its mean is exact:
sum / count), transfer = the KV pull or push alone (sluice_kv_transfer_seconds; in layerwise mode
the prefill worker's: the push tail after the forward); p50/p99 interpolated within the
histogram buckets (Prometheus histogram_quantile), with the bucket that holds each quantile.
Client side (streamed): time to the first token (prefill's) and to the second (decode's first
step), p50/p99 over the requests. --handover-prompt-words sets the prompt length (100 words:
~210 tokens).

Usage: .venv/bin/python bench/kv_transfer_bench.py [--build build] [--tls sm] [--repeats 3]
         [--handover-requests 200] [--out bench/results/kv_transfer.json]
         [--plot bench/results/kv_transfer.png]
"""
import argparse
import concurrent.futures
import json
import os
import pathlib
import platform
import re
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

REPO = pathlib.Path(__file__).resolve().parents[1]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def perftest(binary, test, size, iters, tls, memory="host"):
    env = dict(os.environ, UCX_TLS=tls, UCX_LOG_LEVEL="error")
    # Registered exactly as given, as Sluice's agent registers its KV arrays
    # (transfer/ucx_transfer_agent.cc); UCX's default widens a CUDA registration to the whole
    # allocation, which fails where the driver reports no allocation range.
    env.setdefault("UCX_MEMTYPE_REG_WHOLE_ALLOC_TYPES", "")
    mem = ["-m", "cuda"] if memory == "cuda" else []
    port = str(free_port())
    server = subprocess.Popen([binary, "-p", port], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        run = subprocess.run([binary, "127.0.0.1", "-p", port, "-t", test, "-s", str(size),
                              "-n", str(iters), *mem], env=env, capture_output=True, text=True,
                             timeout=300)
        if run.returncode != 0:
            raise RuntimeError(f"ucx_perftest {test} -s {size} exited {run.returncode}:\n"
                               f"{run.stdout[-2000:]}{run.stderr[-2000:]}")
        out = run.stdout
    finally:
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
    final = [line for line in out.splitlines() if line.startswith("Final:")]
    if not final:
        raise RuntimeError(f"ucx_perftest {test} printed no Final line:\n{out}")
    # Final: iters, 50%ile, avg, overall latency (usec), avg, overall bandwidth (MB/s), rates.
    fields = final[0].split()[1:]
    return float(fields[5]) * 2**20 / 1e9


def sluice(binary, op, sizes_mib, tls, memory="host"):
    env = dict(os.environ, UCX_LOG_LEVEL="error")
    out = subprocess.run([binary, f"--op={op}", f"--transports={tls}", f"--memory={memory}",
                          "--sizes_mib=" + ",".join(map(str, sizes_mib))], env=env,
                         capture_output=True, text=True, timeout=600, check=True).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return {row["batch_bytes"]: row for row in rows}


def spread(values):
    return {"median": round(statistics.median(values), 4), "min": round(min(values), 4),
            "max": round(max(values), 4), "runs": [round(v, 4) for v in values]}


def transfer_part(args, sizes):
    binary = os.path.join(args.build, "bin", "kv_transfer_bench")
    runs = {mib: [] for mib in sizes}
    baseline_error = None  # ucx_perftest cannot run this memory/transport pair: Sluice alone
    for rep in range(args.repeats):
        pulls = sluice(binary, "pull", sizes, args.tls, args.memory)
        pushes = sluice(binary, "push", sizes, args.tls, args.memory)
        for mib in sizes:
            size = mib * 2**20
            iters = max(10, min(1000, (512 * 2**20) // size))
            get = put = None
            if baseline_error is None:
                try:
                    get = perftest(args.perftest, "ucp_get", size, iters, args.tls, args.memory)
                    put = perftest(args.perftest, "ucp_put_bw", size, iters, args.tls,
                                   args.memory)
                except RuntimeError as e:
                    baseline_error = str(e).splitlines()[0] + " " + " ".join(
                        line.strip() for line in str(e).splitlines() if "ERROR" in line)
                    print(f"baseline unavailable, Sluice figures only: {baseline_error}",
                          flush=True)
            run = {"pull": pulls[size], "push": pushes[size], "perftest_get": get,
                   "perftest_put_bw": put}
            runs[mib].append(run)
            base = f" (get {get:.2f})" if get else ""
            base_put = f" (put_bw {put:.2f})" if put else ""
            print(f"repeat {rep} {mib} MiB: pull {run['pull']['gb_per_s']:.2f}{base} "
                  f"push {run['push']['gb_per_s']:.2f}{base_put} GB/s", flush=True)
    results = []
    for mib in sizes:
        rs = runs[mib]
        results.append({
            "batch_bytes": mib * 2**20,
            "block_bytes": rs[0]["pull"]["block_bytes"],
            "num_rma_ops": rs[0]["pull"]["num_rma_ops"],
            "sluice_pull_gb_per_s": spread([r["pull"]["gb_per_s"] for r in rs]),
            "sluice_push_gb_per_s": spread([r["push"]["gb_per_s"] for r in rs]),
            **({} if baseline_error else {
                "ucx_perftest_get_gb_per_s": spread([r["perftest_get"] for r in rs]),
                "ucx_perftest_put_bw_gb_per_s": spread([r["perftest_put_bw"] for r in rs]),
                "ratio_pull_vs_get": spread([r["pull"]["gb_per_s"] / r["perftest_get"]
                                             for r in rs]),
                "ratio_push_vs_put_bw": spread([r["push"]["gb_per_s"] / r["perftest_put_bw"]
                                                for r in rs])}),
            **({"ucx_perftest_error": baseline_error} if baseline_error else {}),
            "pull_call_p50_us": spread([r["pull"]["p50_us"] for r in rs]),
            "pull_call_p99_us": spread([r["pull"]["p99_us"] for r in rs]),
            "push_call_p50_us": spread([r["push"]["p50_us"] for r in rs]),
            "push_call_p99_us": spread([r["push"]["p99_us"] for r in rs]),
        })
    return results


def histogram(text, name):
    """Cumulative buckets [(le, count)] of histogram `name` (summed over label sets)."""
    buckets = {}
    for m in re.finditer(rf'^{name}_bucket{{(?:[^}}]*,)?le="([^"]+)"[^}}]*}} (\S+)$', text, re.M):
        le = float("inf") if m.group(1) == "+Inf" else float(m.group(1))
        buckets[le] = buckets.get(le, 0.0) + float(m.group(2))
    return sorted(buckets.items())


def quantile(q, buckets):
    """Prometheus histogram_quantile: linear within the bucket that holds rank q * count."""
    if not buckets or buckets[-1][1] == 0:
        return None
    total = buckets[-1][1]
    rank = q * total
    lower, below = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if le == float("inf"):
                return {"seconds": lower, "bucket": [lower, None]}
            frac = (rank - below) / (count - below) if count > below else 1.0
            return {"seconds": round(lower + (le - lower) * frac, 6), "bucket": [lower, le]}
        lower, below = le, count
    return None


def stream_times(url, model, prompt, max_tokens):
    """(prompt tokens, seconds to the first streamed token, seconds to the second) of one greedy
    streamed /v1/completions call."""
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens,
                       "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    start = time.monotonic()
    times, prompt_tokens = [], 0
    with urllib.request.urlopen(req, timeout=300) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            if chunk.get("usage"):
                prompt_tokens = chunk["usage"]["prompt_tokens"]
            if any(c.get("text") for c in chunk.get("choices", [])):
                times.append(time.monotonic() - start)
    return prompt_tokens, times[0] if times else None, times[1] if len(times) > 1 else None


def percentile(values, q):
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    k = (len(values) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return round(values[lo] + (values[hi] - values[lo]) * (k - lo), 6)


def handover_part(args):
    sys.path.insert(0, str(REPO / "tests" / "integration"))
    from sluice_cluster import MODEL_DIR, Cluster  # noqa: E402

    os.environ.setdefault("SLUICE_BIN", str(pathlib.Path(args.build).resolve() / "bin" / "sluice"))
    model_dir = pathlib.Path(args.handover_model) if args.handover_model else MODEL_DIR
    out = {"model": str(model_dir), "prompt_words": args.handover_prompt_words}
    for mode in args.handover_modes.split(","):
        cluster = Cluster(1, 1, worker_args=["--kv-transfer-mode", mode,
                                             "--ucx-transports", args.tls,
                                             *args.handover_worker_args.split()],
                          model_dir=model_dir)
        try:
            with urllib.request.urlopen(cluster.url + "/v1/models", timeout=30) as r:
                name = json.loads(r.read())["data"][0]["id"]
            # Distinct prompts (several KV blocks each) so there are no prefix hits.
            words = args.handover_prompt_words
            prompts = [f"Request {i}: " + " ".join(f"word{(i * 7 + j) % 97}" for j in range(words))
                       for i in range(args.handover_requests)]
            with concurrent.futures.ThreadPoolExecutor(args.handover_concurrency) as pool:
                timed = list(pool.map(lambda p: stream_times(cluster.url, name, p, 4), prompts))
            prompt_tokens = [t[0] for t in timed]
            text = cluster.worker_metrics_text("decode-0")
            entry = {"requests": len(prompts),
                     "concurrency": args.handover_concurrency,
                     "prompt_tokens_mean": round(statistics.mean(prompt_tokens), 1),
                     "client_first_token": {"p50": percentile([t[1] for t in timed], 0.5),
                                            "p99": percentile([t[1] for t in timed], 0.99)},
                     "client_second_token": {"p50": percentile([t[2] for t in timed], 0.5),
                                             "p99": percentile([t[2] for t in timed], 0.99)}}
            # Layerwise: the transfer is timed by the prefill worker (decode moves nothing).
            transfer_text = (cluster.worker_metrics_text("prefill-0") if mode == "layerwise"
                             else text)
            for key, metric, source in (("handover", "sluice_kv_handover_seconds", text),
                                        ("transfer", "sluice_kv_transfer_seconds",
                                         transfer_text)):
                b = histogram(source, metric)
                total = sum(float(m) for m in re.findall(rf"^{metric}_sum(?:{{[^}}]*}})? (\S+)$", source,
                                                       re.M))
                count = b[-1][1] if b else 0
                entry[key] = {"count": count, "mean": round(total / count, 6) if count else None,
                              "p50": quantile(0.5, b), "p99": quantile(0.99, b)}
            # A transfer that failed makes decode recompute the prompt: the figures above would
            # then time recomputes, not handovers.
            entry["recomputed"] = sum(float(m) for m in re.findall(
                r"^sluice_decode_transfers_recomputed_total(?:{[^}]*})? (\S+)$", text, re.M))
            out[mode] = entry
            print(f"handover {mode}: {json.dumps(entry)}", flush=True)
            if entry["recomputed"]:
                out["ok"] = False
                print(f"handover {mode}: {entry['recomputed']:.0f} of {len(prompts)} requests "
                      "recomputed their prompt (a KV transfer failed; the decode worker's log "
                      "says why)", flush=True)
        finally:
            cluster.stop()
    return out


def plot(report, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["results"]
    mib = [r["batch_bytes"] / 2**20 for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key, label, style in (("sluice_pull_gb_per_s", "Sluice pull", "o-"),
                              ("ucx_perftest_get_gb_per_s", "ucx_perftest ucp_get", "o--"),
                              ("sluice_push_gb_per_s", "Sluice push", "s-"),
                              ("ucx_perftest_put_bw_gb_per_s", "ucx_perftest ucp_put_bw", "s--")):
        if key not in rows[0]:
            continue  # no ucx_perftest baseline for this memory/transport pair
        med = [r[key]["median"] for r in rows]
        lo = [r[key]["median"] - r[key]["min"] for r in rows]
        hi = [r[key]["max"] - r[key]["median"] for r in rows]
        ax.errorbar(mib, med, yerr=[lo, hi], fmt=style, capsize=3, label=label)
    ax.set_xscale("log", base=2)
    ax.set_xticks(mib)
    ax.set_xticklabels([f"{m:g}" for m in mib])
    ax.set_xlabel("batch (MiB)")
    ax.set_ylabel("GB/s (median, bars: min-max of repeats)")
    ax.set_title(f"KV transfer ({report['transport']['memory']} memory), "
                 f"UCX_TLS={report['transport']['UCX_TLS']}, "
                 f"{report['repeats']} repeats ({report['ucx_version']})")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--tls", default="sm")
    ap.add_argument("--sizes_mib", default="1,4,16,64")
    ap.add_argument("--memory", default="host", choices=["host", "cuda"],
                    help="where both sides' KV lives (cuda: device memory, a CUDA build and "
                         "the CUDA-aware UCX's ucx_perftest, -m cuda)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--perftest", default="ucx_perftest",
                    help="the ucx_perftest of the UCX the build links (same library version)")
    ap.add_argument("--parts", default="transfer,handover",
                    help="which parts to run (the handover part needs build/bin/sluice or "
                         "$SLUICE_BIN)")
    ap.add_argument("--handover-requests", type=int, default=200)
    ap.add_argument("--handover-concurrency", type=int, default=16)
    ap.add_argument("--handover-modes", default="pull,push",
                    help="KV transfer modes of the handover part (pull, push, layerwise)")
    ap.add_argument("--handover-prompt-words", type=int, default=100,
                    help="words per prompt (100: ~210 tokens)")
    ap.add_argument("--handover-model", default="",
                    help="model folder of the handover part (default: models/sluice-mini-moe)")
    ap.add_argument("--handover-worker-args", default="",
                    help='extra worker flags, e.g. "--device cuda --gpu-memory-utilization 0.4"')
    ap.add_argument("--out", default="bench/results/kv_transfer.json")
    ap.add_argument("--plot", default="bench/results/kv_transfer.png")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes_mib.split(",")]
    parts = set(args.parts.split(","))
    load_before = os.getloadavg()[0]
    results = transfer_part(args, sizes) if "transfer" in parts else []
    info = os.path.join(os.path.dirname(args.perftest), "ucx_info")
    try:
        version = subprocess.run([info if os.path.sep in args.perftest else "ucx_info", "-v"],
                                 capture_output=True, text=True).stdout.splitlines()
    except OSError:
        version = []
    version = next((line.strip("# ") for line in version if "version" in line.lower()), "?")
    report = {
        "benchmark": "kv_transfer",
        "transport": {"UCX_TLS": args.tls, "memory": args.memory},
        "ucx_version": version,
        "repeats": args.repeats,
        "host": {"machine": platform.machine(), "cpus": os.cpu_count(),
                 "loadavg_1m_before": load_before, "loadavg_1m_after": os.getloadavg()[0]},
        "units": "GB/s = 1e9 bytes/s; spread = median, min, max over repeats",
        "results": results,
    }
    if "handover" in parts and args.handover_requests > 0:
        report["handover"] = handover_part(args)
        report["sluice_bin"] = os.environ.get("SLUICE_BIN")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
    if args.plot and results:
        plot(report, args.plot)
    if report.get("handover", {}).get("ok") is False:
        sys.exit(1)


if __name__ == "__main__":
    main()
