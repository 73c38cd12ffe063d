"""Greedy decoding through the API equals the Hugging Face reference
(models/sluice-mini-moe/golden.safetensors: input_ids_i, greedy_i = 64 greedy tokens)."""

import pathlib

import pytest
import tokenizers
from golden_logprobs import golden_prompts, read_golden

MODEL_DIR = pathlib.Path(__file__).resolve().parents[2] / "models" / "sluice-mini-moe"


# The I64 tensors (input_ids_i, greedy_i) as lists of ints.
GOLDEN = {name: list(values) for name, (_, values) in
          read_golden(MODEL_DIR / "golden.safetensors").items() if values.typecode == "q"}
PROMPTS = golden_prompts(GOLDEN)


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
