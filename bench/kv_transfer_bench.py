#!/usr/bin/env python3
"""KV transfer throughput beside ucx_perftest on the same transport; writes a JSON report.

Runs, for each batch size (default 1, 4, 16, 64 MiB) and the same UCX_TLS:
  * kv_transfer_bench (transfer/kv_transfer_bench.cc): Sluice pull and push of the batch as
    256 KiB blocks in fragmented runs of 8 blocks, between two processes;
  * ucx_perftest -t ucp_put_bw and -t ucp_get (server + client on loopback, message size = batch).
Bandwidths are GB/s = 1e9 bytes/s (ucx_perftest prints MB/s meaning 2^20 bytes/s; converted).
ratio_pull_vs_put = Sluice pull GB/s / ucx_perftest put GB/s (the issue's yardstick);
ratio_pull_vs_get compares like with like (both RMA reads).

Usage: bench/kv_transfer_bench.py [--build build] [--tls sm] [--out bench/results/kv_transfer.json]
"""
import argparse
import json
import os
import platform
import re
import socket
import subprocess
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def perftest(test, size, iters, tls):
    env = dict(os.environ, UCX_TLS=tls, UCX_LOG_LEVEL="error")
    port = str(free_port())
    server = subprocess.Popen(["ucx_perftest", "-p", port], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        out = subprocess.run(["ucx_perftest", "127.0.0.1", "-p", port, "-t", test, "-s", str(size),
                              "-n", str(iters)], env=env, capture_output=True, text=True,
                             timeout=300, check=True).stdout
    finally:
        server.wait(timeout=30)
    final = [line for line in out.splitlines() if line.startswith("Final:")]
    if not final:
        raise RuntimeError(f"ucx_perftest {test} printed no Final line:\n{out}")
    # Final: iters, 50%ile, avg, overall latency (usec), avg, overall bandwidth (MB/s), rates.
    fields = final[0].split()[1:]
    return float(fields[5]) * 2**20 / 1e9


def sluice(binary, op, sizes_mib, tls):
    env = dict(os.environ, UCX_LOG_LEVEL="error")
    out = subprocess.run([binary, f"--op={op}", f"--transports={tls}",
                          "--sizes_mib=" + ",".join(map(str, sizes_mib))], env=env,
                         capture_output=True, text=True, timeout=600, check=True).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return {row["batch_bytes"]: row for row in rows}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--tls", default="sm")
    ap.add_argument("--sizes_mib", default="1,4,16,64")
    ap.add_argument("--out", default="bench/results/kv_transfer.json")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes_mib.split(",")]
    binary = os.path.join(args.build, "bin", "kv_transfer_bench")
    pulls = sluice(binary, "pull", sizes, args.tls)
    pushes = sluice(binary, "push", sizes, args.tls)
    results = []
    for mib in sizes:
        size = mib * 2**20
        iters = max(10, min(1000, (512 * 2**20) // size))
        put = perftest("ucp_put_bw", size, iters, args.tls)
        get = perftest("ucp_get", size, iters, args.tls)
        pull, push = pulls[size], pushes[size]
        results.append({
            "batch_bytes": size,
            "block_bytes": pull["block_bytes"],
            "num_rma_ops": pull["num_rma_ops"],
            "sluice_pull_gb_per_s": pull["gb_per_s"],
            "sluice_push_gb_per_s": push["gb_per_s"],
            "ucx_perftest_put_bw_gb_per_s": round(put, 4),
            "ucx_perftest_get_gb_per_s": round(get, 4),
            "ratio_pull_vs_put": round(pull["gb_per_s"] / put, 4),
            "ratio_pull_vs_get": round(pull["gb_per_s"] / get, 4),
            "ratio_push_vs_put": round(push["gb_per_s"] / put, 4),
        })
        print(json.dumps(results[-1]))
    report = {
        "benchmark": "kv_transfer",
        "transport": {"UCX_TLS": args.tls},
        "ucx_version": subprocess.run(["ucx_info", "-v"], capture_output=True,
                                      text=True).stdout.splitlines()[0].strip("# "),
        "host": {"machine": platform.machine(), "cpus": os.cpu_count(),
                 "loadavg_1m": os.getloadavg()[0]},
        "units": "GB/s = 1e9 bytes/s",
        "results": results,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
