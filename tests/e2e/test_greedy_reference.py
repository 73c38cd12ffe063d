"""Greedy decoding through the API equals the Hugging Face reference
(models/sluice-mini-moe/golden.safetensors: input_ids_i, greedy_i = 64 greedy tokens)."""

import json
import pathlib
import struct

import pytest
import tokenizers

MODEL_DIR = pathlib.Path(__file__).resolve().parents[2] / "models" / "sluice-mini-moe"


def read_safetensors_ints(path):
    """Returns {name: [int, ...]} for every I64 tensor (pure Python, no numpy)."""
    data = pathlib.Path(path).read_bytes()
    (header_len,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + header_len])
    base = 8 + header_len
    out = {}
    for name, info in header.items():
        if name == "__metadata__" or info["dtype"] != "I64":
            continue
        begin, end = info["data_offsets"]
        count = (end - begin) // 8
        out[name] = list(struct.unpack(f"<{count}q", data[base + begin:base + end]))
    return out


GOLDEN = read_safetensors_ints(MODEL_DIR / "golden.safetensors")
PROMPTS = sorted(int(k.split("_")[-1]) for k in GOLDEN if k.startswith("input_ids_"))


@pytest.fixture(scope="module")
def hf_tokenizer():
    return tokenizers.Tokenizer.from_file(str(MODEL_DIR / "tokenizer.json"))


def test_golden_file_has_prompts():
    assert len(PROMPTS) >= 4
    for i in PROMPTS:
        assert len(GOLDEN[f"greedy_{i}"]) == 64


@pytest.mark.parametrize("i", PROMPTS)
def test_greedy_equals_reference(client, model, hf_tokenizer, i):
    prompt = GOLDEN[f"input_ids_{i}"]
    expected_ids = GOLDEN[f"greedy_{i}"]
    r = client.completions.create(
        model=model, prompt=prompt, max_tokens=64, temperature=0, logprobs=0,
        extra_body={"ignore_eos": True, "skip_special_tokens": False,
                    "return_tokens_as_token_ids": True})
    choice = r.choices[0]
    got_ids = [int(t.split(":", 1)[1]) for t in choice.logprobs.tokens]
    assert got_ids == expected_ids
    assert choice.text == hf_tokenizer.decode(expected_ids, skip_special_tokens=False)
    assert choice.finish_reason == "length"
    assert r.usage.prompt_tokens == len(prompt)
    assert r.usage.completion_tokens == 64
