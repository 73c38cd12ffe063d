#!/usr/bin/env python3
"""Encode throughput: Sluice's C++ tokenizer vs HF `tokenizers`, on the same text, one thread.

Builds nothing. Runs an already built `tokenizer_bench` (--bin) and HF `tokenizers`
(`Tokenizer.encode(text, add_special_tokens=False)`, the same call shape on both sides) in two
modes: the whole text as one string, and each line (with its newline) as its own request (the
serving shape: many short prompts). Checks both produce identical ids and writes a JSON report
(--out) with both throughputs and the ratio sluice/hf per mode. The headline ratio is the
per-line one: HF's whole-text encode of a ~1 MB string is pathologically slow, which would
flatter the ratio.

Default text (when --text is not given): about 1 MB made by repeating real text found under
shared/: the tokenizer golden and chat golden texts, the models' eval.json strings, and the
markdown documents (README/DESIGN/STYLE).

Usage:
  .venv/bin/python bench/tokenizer_throughput.py --bin build-x/bin/tokenizer_bench
"""

import argparse
import hashlib
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import tokenizers  # noqa: E402  (after the thread settings)

REPO = pathlib.Path(__file__).resolve().parent.parent
SHARED = pathlib.Path(os.environ.get("SLUICE_SHARED_DIR", REPO.parent / "shared"))


def _strings(value, out):
    """Collects every string of a JSON value (recursively) into `out`."""
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, list):
        for v in value:
            _strings(v, out)
    elif isinstance(value, dict):
        for v in value.values():
            _strings(v, out)


def default_text(target_bytes):
    """Repeats the real texts under shared/ until the result has at least target_bytes."""
    pieces = []
    golden = json.loads((SHARED / "fixtures/tokenizer/tokenizer_golden.json").read_text())
    pieces += [c["text"] for c in golden["cases"]]
    chat = json.loads((SHARED / "fixtures/tokenizer/chat_golden.json").read_text())
    for conv in chat["conversations"]:
        for key in ("without_generation_prompt", "with_generation_prompt"):
            if isinstance(conv, dict) and isinstance(conv.get(key), dict):
                text = conv[key].get("text")
                if text:
                    pieces.append(text)
    for eval_json in sorted(SHARED.glob("models/*/eval.json")):
        strings = []
        _strings(json.loads(eval_json.read_text()), strings)
        pieces += [s for s in strings if len(s) >= 16]
    for doc in ("DESIGN.md", "STYLE.md", "fixtures/README.md", "models/README.md"):
        path = SHARED / doc
        if path.exists():
            pieces.append(path.read_text())
    block = "\n".join(pieces)
    repeats = max(1, -(-target_bytes // len(block.encode())))
    return "\n".join([block] * repeats)


def split_lines(text):
    """Lines including their '\n' (the C++ --per-line split)."""
    lines = text.split("\n")
    return [line + "\n" for line in lines[:-1]] + ([lines[-1]] if lines[-1] else [])


def run_hf(tokenizer_path, text, iters, per_line):
    tok = tokenizers.Tokenizer.from_file(str(tokenizer_path))
    units = split_lines(text) if per_line else [text]

    def encode_all():
        ids = []
        for unit in units:
            ids += tok.encode(unit, add_special_tokens=False).ids
        return ids

    ids = encode_all()  # warm-up, fills the BPE cache
    start = time.perf_counter()
    for _ in range(iters):
        ids = encode_all()
    seconds = (time.perf_counter() - start) / iters
    nbytes = len(text.encode())
    return ids, {
        "tokens": len(ids),
        "bytes": nbytes,
        "iters": iters,
        "mode": "per_line" if per_line else "whole_text",
        "seconds": seconds,
        "tokens_per_second": len(ids) / seconds,
        "mb_per_second": nbytes / seconds / 1e6,
        "version": tokenizers.__version__,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bin", required=True, help="path to the built tokenizer_bench")
    parser.add_argument("--tokenizer", default=str(SHARED / "fixtures/tokenizer/tokenizer.json"))
    parser.add_argument("--text", help="UTF-8 text file (default: ~1 MB of shared/ texts)")
    parser.add_argument("--target-bytes", type=int, default=1_000_000)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--out", default=str(REPO / "bench/results/tokenizer_throughput.json"))
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        if args.text:
            text_path = pathlib.Path(args.text)
            text = text_path.read_bytes().decode("utf-8")
            source = str(text_path)
        else:
            text = default_text(args.target_bytes)
            text_path = pathlib.Path(tmp) / "text.txt"
            text_path.write_bytes(text.encode())
            source = "generated: repeated shared/ golden, chat, eval and markdown texts"
        modes = {}
        for per_line in (True, False):
            ids_path = pathlib.Path(tmp) / "ids.json"
            cmd = [args.bin, "--tokenizer", args.tokenizer, "--text", str(text_path),
                   "--iters", str(args.iters), "--ids-out", str(ids_path)]
            if per_line:
                cmd.append("--per-line")
            proc = subprocess.run(cmd, check=True, capture_output=True, text=True)
            sluice = json.loads(proc.stdout.strip().splitlines()[-1])
            sluice_ids = json.loads(ids_path.read_text())
            hf_ids, hf = run_hf(args.tokenizer, text, args.iters, per_line)
            mismatch = next((i for i, (a, b) in enumerate(zip(sluice_ids, hf_ids)) if a != b),
                            None)
            if mismatch is None and len(sluice_ids) != len(hf_ids):
                mismatch = min(len(sluice_ids), len(hf_ids))
            modes[hf["mode"]] = {
                "sluice": sluice,
                "hf_tokenizers": hf,
                "ids_equal": mismatch is None,
                "first_mismatch_index": mismatch,
                "ratio_sluice_over_hf": sluice["tokens_per_second"] / hf["tokens_per_second"],
            }

    encoded = text.encode()
    report = {
        "text": {"source": source, "bytes": len(encoded),
                 "sha256": hashlib.sha256(encoded).hexdigest()},
        "tokenizer": args.tokenizer,
        "threads": 1,
        "hf_tokenizers_version": tokenizers.__version__,
        "ids_equal": all(m["ids_equal"] for m in modes.values()),
        "ratio_sluice_over_hf": modes["per_line"]["ratio_sluice_over_hf"],
        "modes": modes,
    }
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    if not report["ids_equal"]:
        print("ids differ between sluice and HF tokenizers", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
