#!/usr/bin/env python3
"""Throughput cost of `--batch-invariant` against the default mode, same run (issue 28).

    python3 bench/batch_invariant_cost.py [--sluice build/bin/sluice] [--model DIR]
        [--device cpu] [--batches 1,16,64] [--max-tokens 32] [--rounds 3]
        [--out bench/results/batch_invariant_cpu.json]

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


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sluice", default=str(REPO / "build" / "bin" / "sluice"))
    parser.add_argument("--model", default=str(REPO / "models" / "sluice-mini-moe"))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=str(REPO / "bench" / "results" /
                                             "batch_invariant_cpu.json"))
    args = parser.parse_args()

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
