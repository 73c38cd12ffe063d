#!/usr/bin/env python3
"""Offline batch inference: `sluice generate` against Hugging Face `generate`, same prompts.

    python3 bench/generate_bench.py --model models/sluice-mini-moe --out generate.json
        [--sluice build/bin/sluice] [--device cuda] [--num-prompts 1000] [--max-tokens 128]
        [--hf-batch-size 1000] [--dummy-weights] [--skip-hf] [--skip-sluice]
        [--sluice-arg=--gpu-memory-utilization=0.5 ...]

Prompts: `--num-prompts` synthetic requests in the formats the trained models learned
(models/README: chat turns asking to quote or locate a verse, or for a fortune, some with a system
prompt; raw verse-line openings), drawn with a fixed seed (`--seed`), rendered with the models'
chat format and tokenized once with the model folder's tokenizer.json (HF `tokenizers`). Both
engines get the same token ids (`prompt` as a token-id list for sluice), so tokenization and
templating cannot differ.

Generation: greedy (temperature 0), exactly `--max-tokens` new tokens per prompt: EOS does not
stop either side (sluice `ignore_eos`, HF with no EOS id), so both produce the same number of
tokens and tokens/s compares like with like. sluice is asked for the sampled token ids
(`logprobs: 0`, `return_tokens_as_token_ids`), which adds a log-softmax per token on the host.

Measured:
  * sluice: one `sluice generate --device DEVICE` run over all prompts (the engine batches them
    continuously, up to `--max-num-seqs` at once: by default the HF batch size, capped at 1024,
    with `--max-num-batched-tokens` 8192 so a step can hold them all). `tokens_per_s` is the figure sluice logs itself: generated tokens over the
    time from the first submission to the last answer (model loading, KV allocation and CUDA
    graph capture excluded); `wall_s` is the whole process, loading included.
  * HF: AutoModelForCausalLM in bf16 on DEVICE (sdpa attention), `generate(do_sample=False)` over
    batches of `--hf-batch-size` prompts (default: all of them at once — the same batch), left
    padded with the pad token. One warm-up batch of 8 prompts first; `tokens_per_s` = generated
    tokens over the timed generate calls (torch.cuda.synchronize() around them).
  * `ratio` = sluice tokens/s / HF tokens/s; `identical_fraction`: prompts whose greedy token ids
    are equal over all `--max-tokens` (bf16 on both sides, but different kernels, batching and
    padding: near-ties, and MoE routing near ties, can flip a token and everything after it);
    `mean_common_prefix` tokens before the first difference; `identical_until_eos_fraction`:
    prompts whose outputs agree up to and including sluice's first EOS (the answer itself:
    past it the model starts a new, low-confidence text where flips are far more common).
`--dummy-weights` runs a folder holding only config.json + tokenizer (Llama/Qwen3 layouts):
sluice with `--load-format dummy`, HF with the same values (dummy_values() mirrors
engine/model/dummy_weights.h; checked equal to sluice's own on the CPU), both rounded to bf16.
The JSON also records the machine (GPU name, torch/transformers versions), the commands and the
settings. Exit code 1 when a run fails or any sluice line is an error.
"""

import argparse
import json
import os
import pathlib
import random
import re
import shlex
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]

BOOKS = [("Genesis", 50), ("Exodus", 40), ("Leviticus", 27), ("Numbers", 36),
         ("Deuteronomy", 34), ("Joshua", 24), ("Judges", 21), ("Ruth", 4), ("1 Samuel", 31),
         ("2 Kings", 25), ("Job", 42), ("Psalm", 150), ("Proverbs", 31), ("Isaiah", 66),
         ("Jeremiah", 52), ("Ezekiel", 48), ("Daniel", 12), ("Matthew", 28), ("Mark", 16),
         ("Luke", 24), ("John", 21), ("Acts", 28), ("Romans", 16), ("Hebrews", 13),
         ("Revelation", 22)]
RAW_ABBREV = ["Ge", "Ex", "Psa", "Pro", "Isa", "Mat", "Joh", "Rom"]
QUOTE = ["Quote {ref}.", "What does {ref} say?", "Recite {ref} from the King James Bible.",
         "{ref}?"]
LOOKUP = ['Where is it written: "{text}"?', 'Which verse says "{text}"?',
          "Give the reference for: {text}"]
FORTUNE = ["Tell me a fortune.", "Give me a fortune.", "I would like a fortune, please."]
SNIPPETS = ["Jesus wept.", "In the beginning God created the heaven and the earth.",
            "The LORD is my shepherd; I shall not want.", "Blessed are the meek",
            "Let there be light", "For God so loved the world", "Love is patient",
            "A soft answer turneth away wrath", "Be still, and know that I am God",
            "The truth shall make you free"]
SYSTEM = "You are a concordance of the King James Bible."
RAW_OPENINGS = ["The LORD is", "And God said,", "Blessed is the man", "And it came to pass",
                "Behold, I", "For the"]


def make_texts(n, seed):
    """n prompt strings in the models' chat format (models/README: eval.json samples)."""
    rng = random.Random(seed)
    texts = []
    for _ in range(n):
        kind = rng.random()
        book, chapters = rng.choice(BOOKS)
        ref = f"{book} {rng.randint(1, chapters)}:{rng.randint(1, 30)}"
        if kind < 0.12:
            texts.append(f"<|begin_of_text|>{rng.choice(RAW_ABBREV)}{rng.randint(1, 50)}:"
                         f"{rng.randint(1, 30)} {rng.choice(RAW_OPENINGS)}")
            continue
        if kind < 0.55:
            user = rng.choice(QUOTE).format(ref=ref)
        elif kind < 0.85:
            user = rng.choice(LOOKUP).format(text=rng.choice(SNIPPETS))
        else:
            user = rng.choice(FORTUNE)
        system = f"<|system|>\n{SYSTEM}<|end_of_text|>\n" if rng.random() < 0.3 else ""
        texts.append(f"<|begin_of_text|>{system}<|user|>\n{user}<|end_of_text|>\n<|assistant|>\n")
    return texts


def tokenize(model_dir, texts):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(pathlib.Path(model_dir) / "tokenizer.json"))
    return [tok.encode(t, add_special_tokens=False).ids for t in texts]


MASK64 = (1 << 64) - 1


def _mix64(z):
    """SplitMix64 finalizer on a Python int (engine/model/dummy_weights.h DummyMix64)."""
    z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & MASK64
    return z ^ (z >> 31)


def dummy_values(name, n, seed=0x5eed):
    """Element 0..n-1 of dummy tensor `name` as float32 numpy values: the rule of
    engine/model/dummy_weights.h (DummyTensorSeed, DummyNormal), so HF can run the weights
    `sluice --load-format dummy` builds without any weights file."""
    import numpy as np

    h = 0xcbf29ce484222325
    for c in name.encode():
        h = ((h ^ c) * 0x100000001b3) & MASK64
    ts = _mix64(h ^ _mix64(seed))
    with np.errstate(over="ignore"):
        z = np.uint64(ts) + np.arange(n, dtype=np.uint64) * np.uint64(0x9e3779b97f4a7c15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xbf58476d1ce4e5b9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94d049bb133111eb)
        z = z ^ (z >> np.uint64(31))
    u1 = ((z >> np.uint64(40)).astype(np.float32) + np.float32(1)) * np.float32(1 / 16777216)
    u2 = ((z >> np.uint64(16)) & np.uint64(0xFFFFFF)).astype(np.float32) * np.float32(
        1 / 16777216)
    r = np.float32(0.02) * np.sqrt(np.float32(-2) * np.log(u1))
    return r * np.cos(np.float32(6.28318530718) * u2)


def fill_dummy(model):
    """Overwrites every parameter of an HF model with the dummy rule: norms 1, biases 0,
    the rest DummyNormal of its checkpoint name (HF Llama/Qwen3 names are the checkpoint's)."""
    import torch

    with torch.no_grad():
        for name, p in model.state_dict().items():
            leaf = name.rsplit(".", 2)[-2] if name.count(".") else name
            if name.endswith("bias"):
                p.zero_()
            elif "norm" in leaf:
                p.fill_(1)
            else:
                v = dummy_values(name, p.numel()).reshape(tuple(p.shape))
                p.copy_(torch.from_numpy(v).to(p.dtype))


def run_sluice(args, prompts, workdir):
    src = workdir / "requests.jsonl"
    dst = workdir / "responses.jsonl"
    with open(src, "w") as f:
        for i, ids in enumerate(prompts):
            f.write(json.dumps({"custom_id": f"p{i}", "prompt": ids, "max_tokens": args.max_tokens,
                                "temperature": 0, "ignore_eos": True, "logprobs": 0,
                                "return_tokens_as_token_ids": True}) + "\n")
    cmd = [args.sluice, "generate", "--model", args.model, "--input", str(src), "--output",
           str(dst), "--device", args.device, "--no-progress"] + args.sluice_arg
    if args.dummy_weights:
        cmd += ["--load-format", "dummy"]
    cmd += ["--max-num-seqs", str(args.max_num_seqs), "--max-num-batched-tokens",
            str(args.max_num_batched_tokens)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    wall = time.perf_counter() - t0
    sys.stderr.write(proc.stderr[-4000:])
    result = {"command": shlex.join(cmd), "returncode": proc.returncode, "wall_s": wall}
    if proc.returncode != 0:
        result["error"] = proc.stderr[-2000:]
        return result, None
    m = re.search(r"wrote (\d+) lines .* in ([\d.]+)s \((\d+) generated tokens, ([\d.]+) tok/s\)",
                  proc.stderr)
    ready = re.search(r"engine ready on \w+: (\d+) KV blocks", proc.stderr)
    if ready:
        result["num_kv_blocks"] = int(ready.group(1))
    outputs, errors = [], 0
    for line in dst.read_text().splitlines():
        r = json.loads(line)
        if "error" in r:
            errors += 1
            outputs.append(None)
            continue
        toks = r["choices"][0]["logprobs"]["tokens"]
        outputs.append([int(t.split(":", 1)[1]) for t in toks])
    result["errors"] = errors
    if m:
        result["generate_s"] = float(m.group(2))
        result["generated_tokens"] = int(m.group(3))
        result["tokens_per_s"] = float(m.group(4))
    return result, outputs


def run_hf(args, prompts):
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, GenerationConfig

    device = args.hf_device or args.device
    if args.dummy_weights:
        config = transformers.AutoConfig.from_pretrained(args.model)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32,
                                                 attn_implementation="sdpa")
        fill_dummy(model)  # float32 values, rounded to bf16 below as the GPU runner does
        model = model.to(torch.bfloat16)
    else:
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16,
                                                     attn_implementation="sdpa")
    model = model.to(device).eval()
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    # generate() fills unset fields of a passed GenerationConfig from the model's own
    # (generation_config.json: eos 1), so EOS is cleared there too.
    model.generation_config.eos_token_id = None
    gen = GenerationConfig(max_new_tokens=args.max_tokens, do_sample=False, eos_token_id=None,
                           pad_token_id=pad, bos_token_id=model.config.bos_token_id)

    def generate(batch):
        width = max(len(p) for p in batch)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, p in enumerate(batch):  # left padding: every row's last prompt token aligned
            ids[i, width - len(p):] = torch.tensor(p)
            mask[i, width - len(p):] = 1
        with torch.inference_mode():
            out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                                 generation_config=gen)
        return out[:, width:].tolist()

    def sync():
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    generate(prompts[:8])  # warm-up: allocations, kernel selection
    sync()
    outputs = []
    t0 = time.perf_counter()
    for b in range(0, len(prompts), args.hf_batch_size):
        outputs += generate(prompts[b:b + args.hf_batch_size])
    sync()
    seconds = time.perf_counter() - t0
    tokens = sum(len(o) for o in outputs)
    info = {"seconds": seconds, "generated_tokens": tokens, "tokens_per_s": tokens / seconds,
            "batch_size": args.hf_batch_size, "device": device, "dtype": "bfloat16",
            "attn_implementation": "sdpa", "torch": torch.__version__,
            "transformers": transformers.__version__}
    if device.startswith("cuda"):
        info["gpu"] = torch.cuda.get_device_name()
    if any(len(o) != args.max_tokens for o in outputs):
        info["error"] = "HF generated a different number of tokens than --max-tokens"
    return info, outputs


def eos_ids(model_dir):
    config = json.loads((pathlib.Path(model_dir) / "config.json").read_text())
    eos = config.get("eos_token_id")
    return set(eos if isinstance(eos, list) else [] if eos is None else [eos])


def compare(a, b, eos=()):
    """Agreement of two lists of greedy outputs. Past the first EOS (generation goes on with
    ignore_eos) a model starts a new, low-confidence text where bf16 near-ties flip tokens far
    more often, so agreement up to the answer's end is reported too: the first EOS of `a`
    included, all tokens when it has none."""
    identical, answer, prefix, n = 0, 0, 0, 0
    for x, y in zip(a, b):
        if x is None or y is None:
            continue
        n += 1
        k = 0
        while k < min(len(x), len(y)) and x[k] == y[k]:
            k += 1
        prefix += k
        identical += x == y
        end = next((i + 1 for i, t in enumerate(x) if t in eos), len(x))
        answer += k >= end
    return {"compared": n, "identical_fraction": identical / n if n else None,
            "identical_until_eos_fraction": answer / n if n else None,
            "mean_common_prefix": prefix / n if n else None}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="Hugging Face model folder")
    ap.add_argument("--sluice", default=os.environ.get("SLUICE_BIN",
                                                       str(REPO / "build" / "bin" / "sluice")))
    ap.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    ap.add_argument("--hf-device", default=None, help="default: --device")
    ap.add_argument("--num-prompts", type=int, default=1000)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--hf-batch-size", type=int, default=0, help="0: all prompts in one batch")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sluice-arg", action="append", default=[],
                    help="extra sluice generate argument (repeat; use --sluice-arg=--flag=value)")
    ap.add_argument("--max-num-seqs", type=int, default=0,
                    help="sluice sequences per step (0: the HF batch size, at most 1024)")
    ap.add_argument("--max-num-batched-tokens", type=int, default=8192,
                    help="sluice tokens per step (prefill chunks + one per decoding sequence)")
    ap.add_argument("--dummy-weights", action="store_true",
                    help="no weights file: sluice --load-format dummy, HF filled by the same rule "
                         "(Llama/Qwen3 layouts)")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--skip-sluice", action="store_true")
    ap.add_argument("--timeout", type=float, default=1800, help="sluice run limit (seconds)")
    ap.add_argument("--out", required=True, help="JSON result path")
    args = ap.parse_args()
    if args.hf_batch_size <= 0:
        args.hf_batch_size = args.num_prompts
    if args.max_num_seqs <= 0:
        args.max_num_seqs = min(args.hf_batch_size, 1024)

    prompts = tokenize(args.model, make_texts(args.num_prompts, args.seed))
    lens = sorted(len(p) for p in prompts)
    result = {"model": args.model, "dummy_weights": args.dummy_weights,
              "device": args.device, "num_prompts": len(prompts),
              "max_tokens": args.max_tokens, "temperature": 0, "ignore_eos": True,
              "seed": args.seed, "sluice_max_num_seqs": args.max_num_seqs,
              "sluice_max_num_batched_tokens": args.max_num_batched_tokens,
              "prompt_tokens": {"total": sum(lens), "min": lens[0], "median": lens[len(lens) // 2],
                                "max": lens[-1]}}
    ok = True
    sluice_out = hf_out = None
    if not args.skip_sluice:
        with tempfile.TemporaryDirectory(prefix="generate_bench-") as tmp:
            result["sluice"], sluice_out = run_sluice(args, prompts, pathlib.Path(tmp))
        ok &= result["sluice"]["returncode"] == 0 and result["sluice"].get("errors", 1) == 0
    if not args.skip_hf:
        try:
            result["hf"], hf_out = run_hf(args, prompts)
            ok &= "error" not in result["hf"]
        except Exception as e:  # recorded, not raised: the sluice half is still worth keeping
            result["hf"] = {"error": f"{type(e).__name__}: {e}"}
            ok = False
    s_tps = result.get("sluice", {}).get("tokens_per_s")
    h_tps = result.get("hf", {}).get("tokens_per_s")
    if s_tps and h_tps:
        result["ratio"] = s_tps / h_tps
    if sluice_out is not None and hf_out is not None:
        result.update(compare(sluice_out, hf_out, eos_ids(args.model)))
    if sluice_out is not None:
        result["sluice_first_outputs"] = sluice_out[:3]
    if hf_out is not None:
        result["hf_first_outputs"] = hf_out[:3]
    pathlib.Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if not k.endswith("_outputs")}, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
