#!/usr/bin/env python3
"""Throughput cost of `--batch-invariant` against the default mode, same run (issue 28).

    python3 bench/batch_invariant_cost.py [--sluice build/bin/sluice] [--model DIR]
        [--device cpu] [--batches 1,16,64] [--max-tokens 32] [--rounds 3]
        [--out bench/results/batch_invariant_cpu.json]
    python3 bench/batch_invariant_cost.py --cuda-decode-bench build/bin/cuda_decode_bench
        [--config bench/configs/llama3-8b] [--batches 1,64,256] [--context 1024]
        [--prefill 4096] [--rounds 3] [--bench-args "--batch-invariant-gemm-ctas 64"]
        [--out bench/results/batch_invariant_cuda.json]

For each batch size B: B synthetic completion requests (random words, 24-48 of them; seeded
sampling at temperature 0.8; exactly --max-tokens new tokens, ignore_eos) go through one
`sluice generate --max-num-seqs B` run per mode. The modes alternate in ABBA order over
--rounds rounds so machine load drifts hit both alike; each run's figure is the tokens/s that
`sluice generate` logs (generated tokens from first submission to last answer, model loading
excluded). Reported per B: the median tokens/s of each mode and
`slowdown` = default median / batch-invariant median (1.0: no cost; the issue's target on the
H200 is <= 1.15 at batch 64); `*_spread` = (max - min) / median of a mode's runs shows the
noise the ratio sits in. `identical_outputs` checks that both modes produced the same text
for every request (on the CPU backend both run the same batch-invariant kernels).

With --cuda-decode-bench (the GPU run): the CUDA runner's decode throughput on a config with
dummy weights (default Llama-3-8B shapes), `cuda_decode_bench --batch-invariant 0|1` run
alternately (ABBA) per round; per batch B the figure is that run's graph-replayed decode
tokens/s (B sequences at --context cached tokens; GPU time per step), and per --prefill length
its prefill tokens/s, each with the same `slowdown` and `*_spread` fields. The two modes'
outputs are not compared here (the default mode is not batch invariant); the bitwise checks
are cuda_model_test's *BatchInvariant* tests.
"""

import argparse
import json
import os
import pathlib
import platform
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
WORDS = ("river stone quiet seven lamp north bread glass wind harbor candle orchard silver "
         "mountain letter garden winter copper window morning").split()
TPS_RE = re.compile(r"generated tokens, ([0-9.]+) tok/s")


def cpu_model():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def write_prompts(path, count, max_tokens, seed):
    rng = random.Random(seed)
    with open(path, "w") as f:
        for i in range(count):
            prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(24, 48)))
            body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.8,
                    "seed": 1000 + i, "ignore_eos": True}
            f.write(json.dumps({"custom_id": f"r{i}", "body": body}) + "\n")


def run_generate(args, prompts, out, batch, invariant):
    cmd = [args.sluice, "generate", "--model", args.model, "--device", args.device,
           "--input", prompts, "--output", out, "--max-num-seqs", str(batch),
           "--no-progress"]
    if invariant:
        cmd.append("--batch-invariant")
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.monotonic() - start
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    match = TPS_RE.search(proc.stderr + proc.stdout)
    if not match:
        sys.exit(f"no tok/s line in the output of {' '.join(cmd)}:\n{proc.stderr[-4000:]}")
    texts = {}
    with open(out) as f:
        for line in f:
            r = json.loads(line)
            if "error" in r:
                sys.exit(f"request failed: {r['error']}")
            texts[r["custom_id"]] = r["choices"][0]["text"]
    return float(match.group(1)), wall, texts, " ".join(cmd)


def run_cuda_bench(args, invariant, out):
    cmd = [args.cuda_decode_bench, "--config", args.config, "--batches", args.batches,
           "--context", str(args.context), "--prefill", args.prefill, "--breakdown", "0",
           "--batch-invariant", "1" if invariant else "0", "--out", out, *args.bench_args.split()]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
                 f"{proc.stdout[-4000:]}")
    with open(out) as f:
        report = json.load(f)
    decode = {int(r["batch"]): float(r["tokens_per_s"]) for r in report["decode"]}
    prefill = {int(r["tokens"]): float(r["tokens_per_s"]) for r in report.get("prefill", [])}
    return decode, prefill, report.get("gpu", "?"), " ".join(cmd)


def summarize(label, key, default_runs, invariant_runs):
    default, invariant = statistics.median(default_runs), statistics.median(invariant_runs)
    return {
        label: key,
        "default_tokens_per_s": default_runs,
        "batch_invariant_tokens_per_s": invariant_runs,
        "default_median": default,
        "batch_invariant_median": invariant,
        "slowdown": default / invariant,
        "default_spread": (max(default_runs) - min(default_runs)) / default,
        "batch_invariant_spread": (max(invariant_runs) - min(invariant_runs)) / invariant,
    }


def cuda_main(args):
    runs = {False: [], True: []}
    commands, gpu = [], "?"
    with tempfile.TemporaryDirectory(prefix="sluice-bi-cuda-") as tmp:
        for r in range(args.rounds):
            order = (False, True) if r % 2 == 0 else (True, False)
            for invariant in order:
                out = os.path.join(tmp, f"run_{r}_{int(invariant)}.json")
                decode, prefill, gpu, cmd = run_cuda_bench(args, invariant, out)
                runs[invariant].append((decode, prefill))
                if r == 0:
                    commands.append(cmd)
                print(f"round {r} {'invariant' if invariant else 'default  '}: decode "
                      + ", ".join(f"B={b} {t:.0f} tok/s" for b, t in sorted(decode.items()))
                      + "".join(f"; prefill {n} {t:.0f} tok/s" for n, t in
                                sorted(prefill.items())), file=sys.stderr)
    decode_results = [summarize("batch", b, [d[b] for d, _ in runs[False]],
                                [d[b] for d, _ in runs[True]])
                      for b in sorted(runs[False][0][0])]
    prefill_results = [summarize("tokens", n, [p[n] for _, p in runs[False]],
                                 [p[n] for _, p in runs[True]])
                       for n in sorted(runs[False][0][1])]
    return {
        "benchmark": "batch_invariant_cost",
        "device": "cuda",
        "gpu": gpu,
        "config": args.config,
        "context": args.context,
        "commit": subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"],
                                 capture_output=True, text=True).stdout.strip(),
        "rounds": args.rounds,
        "bench_args": args.bench_args,
        "commands": commands,
        "results": decode_results,
        "prefill_results": prefill_results,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sluice", default=str(REPO / "build" / "bin" / "sluice"))
    parser.add_argument("--model", default=str(REPO / "models" / "sluice-mini-moe"))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=None,
                        help="default bench/results/batch_invariant_cpu.json (with "
                             "--cuda-decode-bench: batch_invariant_cuda.json)")
    parser.add_argument("--cuda-decode-bench", default=None,
                        help="path of build/bin/cuda_decode_bench: measure the CUDA runner")
    parser.add_argument("--config", default=str(REPO / "bench" / "configs" / "llama3-8b"))
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--prefill", default="4096",
                        help="prefill lengths for --cuda-decode-bench ('' for none)")
    parser.add_argument("--bench-args", default="",
                        help="more cuda_decode_bench flags for both modes, e.g. "
                             "'--batch-invariant-gemm-ctas 64'")
    args = parser.parse_args()
    if args.cuda_decode_bench:
        if args.batches == "1,16,64":
            args.batches = "1,64,256"
        args.out = args.out or str(REPO / "bench" / "results" / "batch_invariant_cuda.json")
        report = cuda_main(args)
        pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)
            f.write("\n")
        print(json.dumps(report, indent=2))
        return
    args.out = args.out or str(REPO / "bench" / "results" / "batch_invariant_cpu.json")

    with open("/proc/loadavg") as f:
        load_at_start = f.read().split()[:3]
    results = []
    commands = []
    with tempfile.TemporaryDirectory(prefix="sluice-bi-bench-") as tmp:
        for batch in [int(b) for b in args.batches.split(",")]:
            prompts = os.path.join(tmp, f"prompts_{batch}.jsonl")
            write_prompts(prompts, batch, args.max_tokens, seed=batch)
            tps = {False: [], True: []}
            texts = {}
            for r in range(args.rounds):
                order = (False, True) if r % 2 == 0 else (True, False)
                for invariant in order:
                    out = os.path.join(tmp, f"out_{batch}_{int(invariant)}.jsonl")
                    t, wall, got, cmd = run_generate(args, prompts, out, batch, invariant)
                    tps[invariant].append(t)
                    texts.setdefault(invariant, got)
                    if r == 0:
                        commands.append(cmd)
                    print(f"batch {batch} {'invariant' if invariant else 'default  '} "
                          f"round {r}: {t:.1f} tok/s ({wall:.1f}s wall)", file=sys.stderr)
            default, invariant = statistics.median(tps[False]), statistics.median(tps[True])
            results.append({
                "batch": batch,
                "requests": batch,
                "max_tokens": args.max_tokens,
                "default_tokens_per_s": tps[False],
                "batch_invariant_tokens_per_s": tps[True],
                "default_median": default,
                "batch_invariant_median": invariant,
                "slowdown": default / invariant,
                # Run-to-run noise of each mode: (max - min) / median.
                "default_spread": (max(tps[False]) - min(tps[False])) / default,
                "batch_invariant_spread": (max(tps[True]) - min(tps[True])) / invariant,
                "identical_outputs": texts[False] == texts[True],
            })

    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    report = {
        "benchmark": "batch_invariant_cost",
        "device": args.device,
        "model": os.path.basename(os.path.normpath(args.model)),
        "machine": {"cpu": cpu_model(),
                    "cores": os.cpu_count(), "load_average_at_start": load_at_start,
                    "load_average_at_end": load},
        "commit": subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"],
                                 capture_output=True, text=True).stdout.strip(),
        "rounds": args.rounds,
        "commands": commands,
        "results": results,
    }
    pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
