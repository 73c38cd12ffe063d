#!/usr/bin/env python3
"""End-to-end cost of structured output: generated tokens/s of `sluice generate` with and
without a JSON Schema on every request, at several batch sizes, in one run.

    .venv/bin/python bench/grammar_throughput.py --device cpu --out bench/results/grammar_throughput_cpu.json
    .venv/bin/python bench/grammar_throughput.py --device cuda --model MODEL_DIR \
        --out bench/results/grammar_throughput_h200.json          (on the GPU machine)

Per batch size B (`--batch-sizes`, default 1 and 64): 2*B requests (at least `--min-prompts`)
run through one `sluice generate --max-num-seqs B` per variant:
  * plain:   no constraint, `ignore_eos`, exactly `--max-tokens` tokens each;
  * schema:  `guided_json` with SCHEMA (an array of at least 64 records, so no request completes
             its document within `--max-tokens` and both variants generate the same number of
             tokens at the same batch occupancy); forced tokens jump forward (the default);
  * schema_no_jump_forward: the same with `--no-grammar-jump-forward` (a model step for every
             token: the cost of masking alone).
Greedy (temperature 0) everywhere. tokens/s is the figure sluice logs (generated tokens from
the first submission to the last answer; model loading excluded); with `--repeats N` the
variants run in turn N times and each keeps its best run (a shared machine's load comes and
goes). `ratio` = variant tokens/s over plain tokens/s at the same batch size (1.0: no cost).
Writes --out (JSON).
"""

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SCHEMA = {
    "type": "array", "minItems": 64,
    "items": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 24},
        "score": {"type": "integer", "minimum": 0, "maximum": 999},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
        "active": {"type": "boolean"}},
        "required": ["name", "score", "tags", "active"]},
}
PROMPTS = ["List the records as JSON.", "Give me the table as a JSON array.",
           "Write the inventory in JSON.", "Records:"]


def run(args, batch, variant, workdir):
    n = max(args.min_prompts, 2 * batch)
    src, dst = workdir / f"in_{variant}_{batch}.jsonl", workdir / f"out_{variant}_{batch}.jsonl"
    with open(src, "w") as f:
        for i in range(n):
            line = {"custom_id": f"r{i}", "prompt": PROMPTS[i % len(PROMPTS)],
                    "max_tokens": args.max_tokens, "temperature": 0}
            if variant == "plain":
                line["ignore_eos"] = True
            else:
                line["guided_json"] = SCHEMA
            f.write(json.dumps(line) + "\n")
    cmd = [args.sluice, "generate", "--model", args.model, "--input", str(src), "--output", str(dst),
           "--device", args.device, "--no-progress", "--max-num-seqs", str(batch)] + args.sluice_arg
    if variant == "schema_no_jump_forward":
        cmd.append("--no-grammar-jump-forward")
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    result = {"batch_size": batch, "variant": variant, "num_requests": n, "command": shlex.join(cmd),
              "returncode": proc.returncode, "wall_s": time.perf_counter() - t0}
    if proc.returncode != 0:
        result["error"] = proc.stderr[-2000:]
        return result
    m = re.search(r"wrote (\d+) lines .* in ([\d.]+)s \((\d+) generated tokens, ([\d.]+) tok/s\)", proc.stderr)
    if m:
        result.update(generate_s=float(m.group(2)), generated_tokens=int(m.group(3)),
                      tokens_per_s=float(m.group(4)))
    finish = {}
    for line in dst.read_text().splitlines():
        r = json.loads(line)
        reason = "error" if "error" in r else r["choices"][0].get("finish_reason")
        finish[reason] = finish.get(reason, 0) + 1
    result["finish_reasons"] = finish
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=str(REPO / "models" / "sluice-mini-moe"))
    ap.add_argument("--sluice", default=os.environ.get("SLUICE_BIN", str(REPO / "build" / "bin" / "sluice")))
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--min-prompts", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--sluice-arg", action="append", default=[], help="extra flag for sluice generate")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for batch in args.batch_sizes:
            runs = {}
            for _ in range(args.repeats):
                for variant in ("plain", "schema", "schema_no_jump_forward"):
                    r = run(args, batch, variant, Path(tmp))
                    runs.setdefault(variant, []).append(r)
                    print(json.dumps({k: v for k, v in r.items() if k != "command"}), file=sys.stderr)
            for variant, rs in runs.items():
                best = max(rs, key=lambda r: r.get("tokens_per_s", 0))
                best["all_tokens_per_s"] = [r.get("tokens_per_s") for r in rs]
                results.append(best)
    ratios = []
    for batch in args.batch_sizes:
        plain = next((r for r in results if r["batch_size"] == batch and r["variant"] == "plain"), {})
        for r in results:
            if r["batch_size"] == batch and r["variant"] != "plain" and plain.get("tokens_per_s") and r.get("tokens_per_s"):
                ratios.append({"batch_size": batch, "variant": r["variant"],
                               "ratio": r["tokens_per_s"] / plain["tokens_per_s"]})
    out = {"device": args.device, "model": args.model, "max_tokens": args.max_tokens, "schema": SCHEMA,
           "results": results, "ratios_to_plain": ratios}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    for r in ratios:
        print(f'batch {r["batch_size"]:3d} {r["variant"]:24s} tokens/s ratio to plain {r["ratio"]:.3f}')


if __name__ == "__main__":
    main()
