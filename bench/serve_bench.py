#!/usr/bin/env python3
"""Serving benchmark with aiperf, the field's load generator: `sluice serve` vs router + 1P + 1D.

Every cell is one `aiperf profile` run against a freshly started server, streaming chat
completions with ignore_eos, the model folder as tokenizer and the server's own token counts
(`--use-server-token-count`), so lengths and ITL are what Sluice reports, not a re-tokenization.

Cells = targets x workloads x loads:
  targets   serve (one `sluice serve` process) and cluster (`sluice router` + 1 prefill +
            1 decode, KV moved between them), both on --device;
  workloads synthetic (fixed --isl/--osl) and sharegpt (a mixture of prompt/output lengths shaped
            like ShareGPT's: mostly short chats, a long tail of long prompts; scaled by --scale
            so it fits the model's context);
  loads     concurrency:N (closed loop, N requests in flight) and rate:R (open loop, Poisson
            arrivals at R requests/s).
Reported per cell (aiperf's own numbers): TTFT and ITL p50/p99, output tokens/s, requests/s,
goodput (requests/s meeting TTFT <= --slo-ttft-ms and ITL <= --slo-itl-ms, aiperf's --goodput),
and errors. The PNG shows TTFT/ITL p99 and output tokens/s per cell, and every inter-chunk
latency over time for the first load of each target.

Usage: bench/serve_bench.sh [args]  (creates bench/.venv-serve with the pinned aiperf), or
       bench/.venv-serve/bin/python bench/serve_bench.py --out bench/results/serve_bench_cpu.json
$SLUICE_BIN picks the binary (default build/bin/sluice).
"""
import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))
from sluice_cluster import Cluster, Serve  # noqa: E402

# (prompt tokens, output tokens, percent): ShareGPT's conversations are mostly short with a long
# tail (vLLM's benchmark_serving on ShareGPT_V3: mean prompt ~ 230 tokens, mean output ~ 200).
SHAREGPT_LIKE = [(64, 64, 35), (192, 128, 35), (512, 256, 20), (1536, 384, 10)]


def seq_dist(scale):
    parts = [f"{max(8, int(i * scale))},{max(4, int(o * scale))}:{p}" for i, o, p in SHAREGPT_LIKE]
    return ";".join(parts)


def aiperf_args(args, url, workload, load, artifact_dir):
    cmd = [args.aiperf, "profile", "--model", args.served_name, "--url", url,
           "--endpoint-type", "chat", "--streaming", "--tokenizer", str(args.model),
           "--use-server-token-count", "--extra-inputs", "ignore_eos:true",
           "--request-count", str(args.requests), "--random-seed", str(args.seed),
           "--output-artifact-dir", str(artifact_dir), "--no-auto-plot",
           "--goodput", f"time_to_first_token:{args.slo_ttft_ms} "
                        f"inter_token_latency:{args.slo_itl_ms}"]
    if args.warmup > 0:  # aiperf refuses 0
        cmd += ["--warmup-request-count", str(args.warmup)]
    if workload == "synthetic":
        cmd += ["--prompt-input-tokens-mean", str(args.isl), "--prompt-input-tokens-stddev", "0",
                "--prompt-output-tokens-mean", str(args.osl), "--prompt-output-tokens-stddev",
                "0"]
    elif workload == "sharegpt":
        cmd += ["--seq-dist", seq_dist(args.scale)]
    else:
        raise SystemExit(f"unknown workload {workload!r}: synthetic or sharegpt")
    kind, _, value = load.partition(":")
    if kind == "concurrency":
        cmd += ["--concurrency", value]
    elif kind == "rate":
        cmd += ["--request-rate", value, "--arrival-pattern", "poisson"]
    else:
        raise SystemExit(f"unknown load {load!r}: concurrency:N or rate:R")
    return cmd


def stat(summary, name, key):
    value = summary.get(name, {}).get(key)
    return None if value is None else round(float(value), 3)


def itl_series(records_path):
    """(seconds since the first request, inter-chunk latency ms) for every streamed chunk."""
    points, t0 = [], None
    for line in records_path.read_text().splitlines():
        rec = json.loads(line)
        meta, metrics = rec.get("metadata", {}), rec.get("metrics", {})
        start = meta.get("request_start_ns")
        ttft = metrics.get("time_to_first_token", {}).get("value")
        gaps = metrics.get("inter_chunk_latency", {}).get("value") or []
        if start is None or ttft is None:
            continue
        t0 = start if t0 is None else min(t0, start)
        t = start / 1e9 + ttft / 1e3
        for gap in gaps:
            t += gap / 1e3
            points.append((t, gap))
    base = (t0 or 0) / 1e9
    return [(round(t - base, 4), round(g, 3)) for t, g in points]


def start_target(target, args):
    dev = ["--device", args.device] + (["--gpu-memory-utilization", str(args.gpu_mem)]
                                       if args.device == "cuda" else [])
    if target == "serve":
        return Serve(model_dir=args.model, args=[*dev, *args.server_args])
    if target == "cluster":
        return Cluster(1, 1, worker_args=[*dev, *args.server_args], model_dir=args.model)
    raise SystemExit(f"unknown target {target!r}: serve or cluster")


def run_cell(args, target, url, workload, load, work_dir):
    name = f"{target}-{workload}-{load.replace(':', '')}"
    artifact_dir = work_dir / name
    cmd = aiperf_args(args, url, workload, load, artifact_dir)
    print(f"[serve_bench] {name}: {' '.join(cmd)}", flush=True)
    begin = time.time()
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=args.cell_timeout_s)
    except subprocess.TimeoutExpired:
        # A cell that cannot finish (an overloaded machine) is recorded as such, with the
        # requests aiperf had completed, and the other cells still run.
        done = artifact_dir / "profile_export.jsonl"
        completed = len(done.read_text().splitlines()) if done.exists() else 0
        print(f"[serve_bench]   timed out after {args.cell_timeout_s} s ({completed} requests "
              "completed)", flush=True)
        return {"target": target, "workload": workload, "load": load,
                "timed_out_after_s": args.cell_timeout_s, "requests_completed": completed}
    (work_dir / f"{name}.log").write_text(result.stdout + result.stderr)
    summary_path = artifact_dir / "profile_export_aiperf.json"
    if result.returncode != 0 or not summary_path.exists():
        raise RuntimeError(f"aiperf failed for {name} (rc {result.returncode}):\n"
                           f"{(result.stdout + result.stderr)[-3000:]}")
    s = json.loads(summary_path.read_text())
    cell = {
        "target": target, "workload": workload, "load": load, "seconds": round(time.time() - begin,
                                                                              1),
        "requests": stat(s, "request_count", "avg"),
        "errors": s.get("error_summary") or [],
        "ttft_ms": {"p50": stat(s, "time_to_first_token", "p50"),
                    "p99": stat(s, "time_to_first_token", "p99")},
        "itl_ms": {"p50": stat(s, "inter_token_latency", "p50"),
                   "p99": stat(s, "inter_token_latency", "p99")},
        "output_tokens_per_s": stat(s, "output_token_throughput", "avg"),
        "requests_per_s": stat(s, "request_throughput", "avg"),
        "goodput_requests_per_s": stat(s, "goodput", "avg"),
        "mean_prompt_tokens": stat(s, "input_sequence_length", "avg"),
        "mean_output_tokens": stat(s, "output_sequence_length", "avg"),
        "aiperf_command": cmd[1:],
    }
    records = artifact_dir / "profile_export.jsonl"
    cell["itl_over_time"] = itl_series(records) if records.exists() else []
    return cell


def plot(cells, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    cells = [c for c in cells if "timed_out_after_s" not in c]
    fig, axes = plt.subplots(2, 2, figsize=(13, 8))
    labels = [f"{c['target']}\n{c['workload']}\n{c['load']}" for c in cells]
    colors = ["tab:blue" if c["target"] == "serve" else "tab:orange" for c in cells]
    for ax, key, title in ((axes[0][0], "ttft_ms", "TTFT p99 (ms)"),
                           (axes[0][1], "itl_ms", "ITL p99 (ms)")):
        ax.bar(range(len(cells)), [c[key]["p99"] or 0 for c in cells], color=colors)
        ax.set_title(title)
        ax.set_xticks(range(len(cells)), labels, fontsize=6)
    ax = axes[1][0]
    ax.bar(range(len(cells)), [c["output_tokens_per_s"] or 0 for c in cells], color=colors)
    ax.set_title("output tokens/s (blue: serve, orange: router + 1P + 1D)")
    ax.set_xticks(range(len(cells)), labels, fontsize=6)
    ax = axes[1][1]
    shown = set()
    for c in cells:
        if c["target"] in shown or not c["itl_over_time"]:
            continue
        shown.add(c["target"])
        ts, gaps = zip(*c["itl_over_time"])
        ax.scatter(ts, gaps, s=3, label=f"{c['target']} ({c['workload']}, {c['load']})")
    ax.set_title("inter-chunk latency over time")
    ax.set_xlabel("seconds")
    ax.set_ylabel("ms")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=pathlib.Path, default=REPO / "models" / "sluice-mini-moe")
    ap.add_argument("--served-name", default=None, help="default: the model folder's name")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--gpu-mem", type=float, default=0.4,
                    help="--gpu-memory-utilization per process with --device cuda")
    ap.add_argument("--targets", default="serve,cluster")
    ap.add_argument("--workloads", default="synthetic,sharegpt")
    ap.add_argument("--loads", default="concurrency:4,rate:1")
    ap.add_argument("--requests", type=int, default=32, help="requests per cell")
    ap.add_argument("--isl", type=int, default=256, help="synthetic prompt tokens")
    ap.add_argument("--osl", type=int, default=64, help="synthetic output tokens")
    ap.add_argument("--scale", type=float, default=0.5, help="sharegpt-like length scale")
    ap.add_argument("--slo-ttft-ms", type=float, default=1000)
    ap.add_argument("--slo-itl-ms", type=float, default=50)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=2, help="warm-up requests per cell, not counted")
    ap.add_argument("--cell-timeout-s", type=float, default=900)
    ap.add_argument("--aiperf", default=shutil.which("aiperf") or
                    str(pathlib.Path(sys.executable).parent / "aiperf"))
    ap.add_argument("--server-args", nargs=argparse.REMAINDER, default=[],
                    help="extra arguments for every sluice process (last on the line)")
    ap.add_argument("--out", type=pathlib.Path, default=REPO / "bench/results/serve_bench_cpu.json")
    ap.add_argument("--plot", type=pathlib.Path, default=None, help="default: --out with .png")
    ap.add_argument("--note", default="", help="recorded with the machine (e.g. what else ran)")
    args = ap.parse_args()
    args.model = args.model.resolve()
    args.served_name = args.served_name or args.model.name
    if not os.path.exists(args.aiperf):
        raise SystemExit(f"aiperf not found at {args.aiperf}: run bench/serve_bench.sh, which "
                         "installs the pinned aiperf into bench/.venv-serve")
    version = subprocess.run([args.aiperf, "--version"], capture_output=True, text=True)
    work_dir = pathlib.Path(tempfile.mkdtemp(prefix="sluice-serve-bench-"))
    load_at_start = os.getloadavg()
    cells = []
    for target in args.targets.split(","):
        server = start_target(target, args)
        try:
            for workload in args.workloads.split(","):
                for load in args.loads.split(","):
                    cells.append(run_cell(args, target, server.url, workload, load, work_dir))
                    c = cells[-1]
                    if "timed_out_after_s" in c:
                        continue
                    print(f"[serve_bench]   TTFT p50/p99 {c['ttft_ms']['p50']}/"
                          f"{c['ttft_ms']['p99']} ms, ITL p50/p99 {c['itl_ms']['p50']}/"
                          f"{c['itl_ms']['p99']} ms, {c['output_tokens_per_s']} tok/s, goodput "
                          f"{c['goodput_requests_per_s']} req/s", flush=True)
        finally:
            server.stop()
    result = {
        "bench": "serve_bench", "tool": "aiperf", "aiperf_version": version.stdout.strip(),
        "device": args.device, "model": args.served_name,
        "slo": {"ttft_ms": args.slo_ttft_ms, "itl_ms": args.slo_itl_ms},
        "sharegpt_like_seq_dist": seq_dist(args.scale),
        # A shared machine's other work shows here: figures under a load average well above
        # the core count are from a loaded machine, comparable only to runs under like load.
        "machine": {"cores": os.cpu_count(), "load_average_at_start": load_at_start,
                    "load_average_at_end": os.getloadavg(), "note": args.note},
        "command": sys.argv, "artifacts": str(work_dir), "cells": cells,
    }
    plot(cells, args.plot or args.out.with_suffix(".png"))
    for cell in cells:  # the samples stay in the artifacts' profile_export.jsonl
        cell["itl_samples"] = len(cell.pop("itl_over_time", []))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"[serve_bench] wrote {args.out}")


if __name__ == "__main__":
    main()
