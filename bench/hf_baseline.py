#!/usr/bin/env python3
"""Hugging Face transformers baseline for bench/cuda_decode_bench.cc, on the same GPU.

    python3 bench/hf_baseline.py [--config bench/configs/llama3-8b] [--batches 1,64]
        [--prefill 4096,16384] [--out hf.json]

--config may name a Llama config or bench/configs/deepseek-v2-lite (DeepseekV3ForCausalLM);
an empty --batches or --prefill skips that part.

Builds the model from its config.json with random init (no download; bf16, SDPA attention) and
measures, with torch.cuda.synchronize() around wall-clock timers:
  * decode ITL at batch 1 and tokens/s at batch 64 (--batches), 1k-token prompts (--context),
    `generate(do_sample=False)` with a static and with a dynamic cache. The prompt's prefill is
    taken out by timing generate twice, with 1 and with 1 + N new tokens (min_new_tokens set so
    EOS cannot stop it early): ITL = (t(1+N) - t(1)) / N, tokens/s = batch / ITL;
  * prefill tokens/s of one forward pass over one sequence of 4k and 16k tokens (--prefill),
    `logits_to_keep=1` (only the last row's logits, as a serving engine computes them).
No torch.compile: generate would auto-compile the forward for a static cache, and recompile for
every new cache length (minutes per call); `generation_config.disable_compile` keeps it eager,
so "static" here is the eager static cache.
"""

import argparse
import json
import time

import torch
import transformers
from transformers import (DeepseekV3Config, DeepseekV3ForCausalLM, LlamaConfig,
                          LlamaForCausalLM)

# config.json model_type -> (config class, model class). deepseek_v3 also serves the
# DeepSeek-V2-Lite shapes of bench/configs/deepseek-v2-lite (same layers and FLOPs; HF's V3 routes
# with sigmoid scores where V2 uses softmax, which does not change the work).
MODELS = {"llama": (LlamaConfig, LlamaForCausalLM),
          "deepseek_v3": (DeepseekV3Config, DeepseekV3ForCausalLM)}


def timed(fn, reps=1):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        out = fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps, out


def decode(model, batch, context, new_tokens, cache, vocab):
    gen = torch.Generator(device="cuda").manual_seed(batch)
    ids = torch.randint(8, vocab, (batch, context), device="cuda", generator=gen)
    mask = torch.ones_like(ids)

    def run(n):
        return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n,
                              min_new_tokens=n, do_sample=False, cache_implementation=cache,
                              pad_token_id=0)

    run(2)  # warm-up (allocations, kernels)
    t1, _ = timed(lambda: run(1))
    tn, out = timed(lambda: run(1 + new_tokens))
    assert out.shape[1] == context + 1 + new_tokens, out.shape
    itl = (tn - t1) / new_tokens
    return {"batch": batch, "context": context, "cache": cache, "new_tokens": new_tokens,
            "itl_ms": itl * 1e3, "tokens_per_s": batch / itl}


def prefill(model, tokens, vocab):
    ids = torch.randint(8, vocab, (1, tokens), device="cuda")
    with torch.inference_mode():
        model(input_ids=ids, logits_to_keep=1, use_cache=False)  # warm-up
        t, _ = timed(lambda: model(input_ids=ids, logits_to_keep=1, use_cache=False), reps=3)
    return {"tokens": tokens, "ms": t * 1e3, "tokens_per_s": tokens / t}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--config", default="bench/configs/llama3-8b")
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--batches", default="1,64")
    p.add_argument("--prefill", default="4096,16384")
    p.add_argument("--out", default="")
    a = p.parse_args()
    with open(f"{a.config}/config.json") as f:
        cfg = json.load(f)
    cfg = {k: v for k, v in cfg.items() if not k.startswith("_")}
    config_cls, model_cls = MODELS[cfg.get("model_type", "llama")]
    config = config_cls(**cfg)
    config.max_position_embeddings = max(config.max_position_embeddings, 16384 + 64)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = model_cls._from_config(config, dtype=torch.bfloat16, attn_implementation="sdpa")
    model.eval()
    model.generation_config.disable_compile = True
    result = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "config": a.config,
        "model_class": model_cls.__name__,
        "attn_implementation": "sdpa",
        "dtype": "bfloat16",
        "torch_compile": False,
        "decode": [],
        "prefill": [],
    }
    for b in [int(x) for x in a.batches.split(",") if x]:  # "" skips decode
        for cache in ("static", "dynamic"):
            r = decode(model, b, a.context, a.new_tokens, cache, config.vocab_size)
            print(json.dumps(r), flush=True)
            result["decode"].append(r)
            torch.cuda.empty_cache()
    for t in [int(x) for x in a.prefill.split(",") if x]:
        r = prefill(model, t, config.vocab_size)
        print(json.dumps(r), flush=True)
        result["prefill"].append(r)
    text = json.dumps(result, indent=2)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
