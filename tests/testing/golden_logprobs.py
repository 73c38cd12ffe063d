"""Reference logprobs from a model folder's golden.safetensors (the float32 logits transformers
gave for its golden prompts), in pure Python: what the served prompt logprobs and perplexity are
checked against (tests) and compared with (bench/ppl.py --reference).

Tensors: input_ids_<i> (I64 [T]) and logits_<i> (F32 [T, vocab]) per golden prompt i.
"""

import array
import json
import math
import pathlib


def read_golden(path):
    """{name: (shape, values)} of the I64 and F32 tensors of a safetensors file (values an
    array.array of int64 or float32)."""
    data = pathlib.Path(path).read_bytes()
    header_len = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + header_len])
    base = 8 + header_len
    out = {}
    for name, info in header.items():
        if name == "__metadata__" or info["dtype"] not in ("I64", "F32"):
            continue
        begin, end = info["data_offsets"]
        values = array.array("q" if info["dtype"] == "I64" else "f")
        values.frombytes(data[base + begin:base + end])
        out[name] = (info["shape"], values)
    return out


def golden_prompts(golden):
    """The indices i of the golden prompts, ascending."""
    return sorted(int(k.rsplit("_", 1)[1]) for k in golden if k.startswith("input_ids_"))


def logit_rows(golden, i):
    """(prompt ids, [the logits row of every prompt position])."""
    _, ids = golden[f"input_ids_{i}"]
    (rows, vocab), logits = golden[f"logits_{i}"]
    return list(ids), [logits[p * vocab:(p + 1) * vocab] for p in range(rows)]


def log_sum_exp(row):
    """log(sum(exp(row))) in float64, shifted by the maximum."""
    m = max(row)
    return m + math.log(math.fsum(math.exp(x - m) for x in row))


def reference_logprobs(golden, i):
    """(prompt ids, [log_softmax(logits[p])[ids[p + 1]] for every p < T - 1]) in float64."""
    ids, rows = logit_rows(golden, i)
    return ids, [rows[p][ids[p + 1]] - log_sum_exp(rows[p]) for p in range(len(rows) - 1)]


def top_tokens(row, k):
    """The k most likely token ids of a logits row, ties by the lower id."""
    return sorted(range(len(row)), key=lambda t: (-row[t], t))[:k]


def reference_top(golden, i, p, k):
    """The k most likely next tokens after position p of golden prompt i."""
    (_, vocab), logits = golden[f"logits_{i}"]
    return top_tokens(logits[p * vocab:(p + 1) * vocab], k)


def ppl(logprobs):
    """exp(-mean logprob); 0.0 for none."""
    return math.exp(-math.fsum(logprobs) / len(logprobs)) if logprobs else 0.0
