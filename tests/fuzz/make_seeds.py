#!/usr/bin/env python3
"""Writes the seed corpus of each fuzz target (tests/fuzz/*_fuzz.cc) from the test fixtures.

  make_seeds.py OUT_DIR [--shared ../shared]

OUT_DIR/<target>/ receives one file per seed; the input layout of each target is described at
the top of its .cc file. The checked-in tests/fuzz/corpus/<target>/ (hand-written seeds and
the regression inputs of past findings) is used as well, by scripts/fuzz.sh.
"""
import argparse
import glob
import hashlib
import json
import os
import re
import struct

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def write(out_dir, target, data):
    if isinstance(data, str):
        data = data.encode()
    d = os.path.join(out_dir, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, hashlib.sha1(data).hexdigest()), "wb") as f:
        f.write(data)


def raw_literals(path):
    """The C++ raw string literals R"(...)" of a test file."""
    return re.findall(r'R"\((.*?)\)"', open(path, encoding="utf-8").read(), re.S)


def tokenizer_seeds(out, shared):
    texts = set()
    for golden in [f"{shared}/fixtures/tokenizer/tokenizer_golden.json",
                   f"{shared}/tokenizers/llama3/tokenizer_golden.json",
                   f"{shared}/tokenizers/qwen2/tokenizer_golden.json",
                   f"{ROOT}/tests/fixtures/llama-spm/tokenizer_golden.json"]:
        if not os.path.exists(golden):
            continue
        for case in json.load(open(golden, encoding="utf-8")).get("cases", []):
            if isinstance(case.get("text"), str):
                texts.add(case["text"])
    for i, text in enumerate(sorted(texts)[:200]):
        write(out, "tokenizer_fuzz", bytes([i % 4, i % 8]) + text.encode())


def chat_templates(shared):
    templates = []
    for cfg in (glob.glob(f"{shared}/fixtures/*/tokenizer_config.json")
                + glob.glob(f"{shared}/tokenizers/*/tokenizer_config.json")
                + glob.glob(f"{ROOT}/tests/fixtures/*/tokenizer_config.json")):
        t = json.load(open(cfg, encoding="utf-8")).get("chat_template")
        if isinstance(t, list):
            templates += [x["template"] for x in t if isinstance(x, dict) and "template" in x]
        elif isinstance(t, str):
            templates.append(t)
    return templates


def jinja_seeds(out, shared):
    contexts = ['']
    chat = f"{shared}/fixtures/tokenizer/chat_golden.json"
    if os.path.exists(chat):
        for conv in json.load(open(chat, encoding="utf-8"))["conversations"][:6]:
            contexts.append(json.dumps({"messages": conv["messages"], "add_generation_prompt": True,
                                        "bos_token": "<s>", "eos_token": "</s>"}))
    for t in chat_templates(shared):
        for c in contexts:
            write(out, "jinja_fuzz", t + "\0" + c)
    for t in raw_literals(f"{ROOT}/tests/unit/jinja_test.cc"):
        if "{" in t:
            write(out, "jinja_fuzz", t)


def model_config_seeds(out, shared):
    for cfg in (glob.glob(f"{shared}/fixtures/*/config.json") + glob.glob(f"{shared}/models/*/config.json")
                + glob.glob(f"{ROOT}/tests/fixtures/*/config.json") + glob.glob(f"{ROOT}/models/*/config.json")):
        write(out, "model_config_fuzz", open(cfg, "rb").read())


def safetensors_file(tensors, metadata=None):
    header, data = {}, b""
    for name, (dtype, shape, payload) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(payload)]}
        data += payload
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data


def safetensors_seeds(out, shared):
    write(out, "safetensors_fuzz", safetensors_file({
        "w": ("F32", [2, 2], struct.pack("<4f", 1, 2, 3, 4)),
        "b": ("BF16", [3], b"\x80\x3f\x00\x40\x40\x40"),
        "h": ("F16", [1], b"\x00\x3c")}, {"format": "pt"}))
    write(out, "safetensors_fuzz", safetensors_file({
        "i": ("I64", [2], struct.pack("<2q", -1, 7)), "j": ("I32", [1, 1], struct.pack("<i", 5)),
        "u": ("U8", [3], b"abc"), "k": ("BOOL", [1], b"\x01"), "d": ("F64", [1], struct.pack("<d", 0.5)),
        "e": ("F32", [0, 4], b""), "s": ("I8", [], b"\xff")}))
    # A real checkpoint's header (tensors dropped: offsets then point past the file's end).
    for path in glob.glob(f"{shared}/fixtures/*/model.safetensors")[:2]:
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            if n < 65536:
                write(out, "safetensors_fuzz", struct.pack("<Q", n) + f.read(n))


def grammar_seeds(out):
    lits = []
    for test in ["json_schema_test.cc", "regex_ebnf_test.cc", "structured_output_test.cc",
                 "grammar_matcher_test.cc"]:
        path = f"{ROOT}/tests/unit/grammar/{test}"
        if os.path.exists(path):
            lits += raw_literals(path)
    lits += ['root ::= "yes" | "no"', 'root ::= [a-z]+ ("," [a-z]+)*', r"\d{3}-[A-Z]{2,4}", "(ab|cd)*e?",
             '{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]}']
    for lit in sorted(set(lits)):
        kinds = [2] if lit.lstrip().startswith("{") else [0, 1]
        for k in kinds:
            write(out, "grammar_fuzz", bytes([k]) + lit.encode() + b'\0{"a":1}')
    write(out, "grammar_fuzz", b"\x03yes\nno\nmaybe\0yes")
    write(out, "grammar_fuzz", b"\x04\0{\"x\": [1, true]}")


def http_seeds(out):
    def req(method, target, body=None, headers=()):
        lines = [f"{method} {target} HTTP/1.1", "Host: localhost"] + list(headers)
        if body is not None:
            b = json.dumps(body) if not isinstance(body, str) else body
            lines += ["Content-Type: application/json", f"Content-Length: {len(b.encode())}"]
            return ("\r\n".join(lines) + "\r\n\r\n" + b).encode()
        return ("\r\n".join(lines) + "\r\n\r\n").encode()

    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    bodies = [
        ("/v1/chat/completions", {"model": "fuzz-model", "messages": msgs, "max_tokens": 4}),
        ("/v1/chat/completions", {"model": "fuzz-model", "messages": msgs, "stream": True,
                                  "stream_options": {"include_usage": True}, "logprobs": True, "top_logprobs": 2,
                                  "n": 2, "stop": ["x", "y"], "seed": 3, "temperature": 0.5}),
        ("/v1/chat/completions", {"model": "fuzz-model", "messages": [{"role": "user", "content": [
            {"type": "text", "text": "a"}]}], "response_format": {"type": "json_schema", "json_schema": {
                "name": "x", "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}}}),
        ("/v1/chat/completions", {"model": "fuzz-model", "messages": msgs, "tools": [{"type": "function",
            "function": {"name": "f", "parameters": {"type": "object"}}}], "tool_choice": "auto"}),
        ("/v1/completions", {"model": "fuzz-model", "prompt": "Hello", "max_tokens": 3, "logprobs": 2,
                             "echo": True, "prompt_logprobs": 1}),
        ("/v1/completions", {"model": "fuzz-model", "prompt": [[1, 2, 3], [70, 71]], "stream": True,
                             "n": 2, "best_of": 2}),
        ("/v1/completions", {"model": "fuzz-model", "prompt": ["a", "b"], "guided_regex": "[ab]+",
                             "logit_bias": {"5": -100}, "min_tokens": 1, "ignore_eos": True}),
        ("/v1/responses", {"model": "fuzz-model", "input": "Hi", "max_output_tokens": 4}),
        ("/v1/responses", {"model": "fuzz-model", "input": [{"role": "user", "content": "Hi"}],
                           "stream": True, "instructions": "x"}),
    ]
    for mode, (target, body) in enumerate(bodies):
        write(out, "http_openai_fuzz", bytes([mode * 3 % 16]) + req("POST", target, body))
        write(out, "http_openai_fuzz", bytes([1]) + req("POST", target, body, ["Authorization: Bearer sk-fuzz"]))
    for target in ["/health", "/v1/models", "/v1/models/fuzz-model", "/metrics", "/nope"]:
        write(out, "http_openai_fuzz", b"\x00" + req("GET", target))
    write(out, "http_openai_fuzz", b"\x00" + req("DELETE", "/v1/models"))
    write(out, "http_openai_fuzz", b"\x00POST /v1/completions HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked"
          b"\r\n\r\n5\r\n{\"pro\r\n0\r\n\r\n")


def varint(n):
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def pb_field(num, value):
    """One protobuf field: int -> varint (wire type 0), bytes -> length-delimited (2)."""
    if isinstance(value, int):
        return varint(num << 3) + varint(value)
    return varint((num << 3) | 2) + varint(len(value)) + value


def kv_descriptor(address, regions):
    out = struct.pack("<II", 0x44564B53, 1) + struct.pack("<I", len(address)) + address
    out += struct.pack("<I", len(regions))
    for base, num_blocks, block_bytes, rkey in regions:
        out += struct.pack("<Qqq", base, num_blocks, block_bytes) + struct.pack("<I", len(rkey)) + rkey
    return out


def worker_wire_seeds(out):
    regions = [(0x7F0000000000 + i * 8 * 64, 8, 64, b"rkey%d" % i) for i in range(4)]
    desc = kv_descriptor(b"ucx-address-bytes", regions)
    layout = pb_field(1, 2) + pb_field(2, 16) + pb_field(3, 8) + pb_field(4, 4) + pb_field(5, 8)
    for reserved, runs in [(4, [(0, 4)]), (5, [(2, 2), (6, 3)]), (1, [(7, 1)]), (0, []),
                           (3, [(0x7FFFFFFE, 1), (1, 2)])]:
        msg = pb_field(1, desc)
        for first, num in runs:
            msg += pb_field(2, pb_field(1, first) + pb_field(2, num))
        msg += pb_field(3, layout) + pb_field(4, 40)
        write(out, "worker_wire_fuzz", bytes([reserved]) + msg)
    write(out, "worker_wire_fuzz", bytes([2]) + pb_field(1, kv_descriptor(b"a", regions[:2])))


def kvstore_seeds(out):
    # op bytes (kvstore_fuzz.cc): 0/1 PutInline n size salt keys..., 2 GetInline n keys...,
    # 3 Exists n keys..., 4 BeginPut n size salt keys... lease, 5 CommitPut how, 6 BeginGet n
    # keys... lease, 7 Release which.
    write(out, "kvstore_fuzz", bytes([1, 1, 0, 5, 0, 1, 2, 0, 0, 1, 3, 2, 0, 1, 0, 1]))
    write(out, "kvstore_fuzz", bytes([4, 1, 0, 9, 1, 2, 10, 5, 0, 6, 0, 1, 2, 10, 7, 1]))
    write(out, "kvstore_fuzz", bytes([4, 2, 3, 9, 1, 2, 2, 3, 10, 5, 0x80, 2, 1, 1, 2, 7, 2]))
    write(out, "kvstore_fuzz", bytes([1, 2, 6, 0x80, 0, 1, 0, 2, 1, 2, 1, 0, 0]))
    # Enough puts to fill the arena: eviction to SSD, then reads that promote back.
    seq = b""
    for h in range(6):
        seq += bytes([1, 2, 3, h, 0, h, 1, h])
    write(out, "kvstore_fuzz", seq + bytes([2, 2, 0, 0, 1, 0, 6, 1, 0, 0, 10]))


def fixed32(num, value):
    """A float field (wire type 5)."""
    return varint((num << 3) | 5) + struct.pack("<f", value)


def packed(num, values):
    return pb_field(num, b"".join(varint(v & 0xFFFFFFFFFFFFFFFF) for v in values))


def worker_request_seeds(out):
    # Byte 0: 0 PrefillRequest, 1 ReserveRequest, 2 DecodeRequest; byte 1: transfer outcome
    # (bit 0 OK) and first token (the rest); then the message (worker_request_fuzz.cc).
    greedy = pb_field(3, fixed32(1, 0.0) + pb_field(9, 4))
    sampled = pb_field(3, fixed32(1, 0.8) + fixed32(2, 0.9) + pb_field(3, 5) + fixed32(7, 1.3)
                       + fixed32(5, 0.5) + pb_field(8, 7) + pb_field(9, 6) + pb_field(10, 2)
                       + packed(12, [9]) + pb_field(16, 3) + pb_field(19, pb_field(1, 4)
                                                                    + fixed32(2, 5.0))
                       + pb_field(20, packed(1, [5, 6])) + pb_field(21, 2))
    for prompt in ([3, 4, 5], list(range(2, 40)), [7] * 17):
        for kind in (0, 1, 2):
            for sampling in (greedy, sampled):
                msg = pb_field(1, b"r-%d" % kind) + packed(2, prompt) + sampling
                write(out, "worker_request_fuzz", bytes([kind, (5 << 1) | 1]) + msg)
    # Salt, priority, a migration's resumed tokens, an image without a vision model.
    write(out, "worker_request_fuzz", bytes([0, 1]) + pb_field(1, b"p") + packed(2, [3, 4, 5, 6])
          + greedy + pb_field(5, b"tenant") + pb_field(6, 3))
    write(out, "worker_request_fuzz", bytes([2, 0]) + pb_field(1, b"m") + packed(2, [3, 4, 5])
          + greedy + packed(7, [8, 9]))
    image = pb_field(1, 1) + pb_field(2, 2) + pb_field(3, bytes(16)) + pb_field(4, bytes(16))
    write(out, "worker_request_fuzz", bytes([1, 3]) + pb_field(1, b"i") + packed(2, [3, 4, 5, 6])
          + greedy + pb_field(7, image))


def image_seeds(out, shared):
    # Byte 0: the limits (bit 0: 4096 pixels), then the file (image_decode_fuzz.cc).
    paths = sorted(glob.glob(f"{ROOT}/tests/fixtures/images/*")
                   + glob.glob(f"{shared}/fixtures/llava-tiny/image_*"))
    for path in paths:
        data = open(path, "rb").read()
        if len(data) > 64 * 1024:
            continue
        for limits in (0, 1):
            write(out, "image_decode_fuzz", bytes([limits]) + data)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--shared", default=os.path.join(os.path.dirname(ROOT), "shared"))
    a = p.parse_args()
    tokenizer_seeds(a.out, a.shared)
    jinja_seeds(a.out, a.shared)
    model_config_seeds(a.out, a.shared)
    safetensors_seeds(a.out, a.shared)
    grammar_seeds(a.out)
    http_seeds(a.out)
    worker_wire_seeds(a.out)
    kvstore_seeds(a.out)
    worker_request_seeds(a.out)
    image_seeds(a.out, a.shared)


if __name__ == "__main__":
    main()
