"""The llava-tiny fixture (../shared/fixtures/llava-tiny) for the vision tests of both suites
(tests/e2e, tests/integration): its reference tensors, its two chat prompts, image parts in the
OpenAI convention, and the bad images every server must refuse with a 400 naming the problem."""

import base64
import io
import json
import pathlib
import struct
import zlib

import numpy as np
from PIL import Image

REPO = pathlib.Path(__file__).resolve().parents[2]
FIXTURE = REPO.parent / "shared" / "fixtures" / "llava-tiny"
# The limits the vision tests start servers with (flags below): the bad images cross them.
MAX_PIXELS = 1_000_000
MAX_BYTES = 100_000
LIMIT_ARGS = ["--limit-mm-per-prompt", '{"image": 3}', "--max-image-pixels", str(MAX_PIXELS),
              "--max-image-bytes", str(MAX_BYTES), "--max-model-len", "256"]


def golden(name):
    """A tensor of the fixture's golden.safetensors (greedy_N, input_ids_N, features ...)."""
    raw = (FIXTURE / "golden.safetensors").read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    meta = json.loads(raw[8:8 + n])[name]
    begin, end = meta["data_offsets"]
    dtype = {"I64": np.int64, "F32": np.float32}[meta["dtype"]]
    return np.frombuffer(raw[8 + n + begin:8 + n + end], dtype=dtype).reshape(meta["shape"])


def want_text(tokenizer, case):
    """The reference greedy completion of prompt `case` as text."""
    return tokenizer.decode(golden(f"greedy_{case}").tolist(), skip_special_tokens=True)


def data_url(data: bytes, mime="image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def image_part(data: bytes, mime="image/png", detail="auto"):
    return {"type": "image_url", "image_url": {"url": data_url(data, mime), "detail": detail}}


def fixture_image(name):
    return (FIXTURE / name).read_bytes()


def png(array) -> bytes:
    out = io.BytesIO()
    Image.fromarray(array).save(out, "PNG")
    return out.getvalue()


def noise_png(rng, shape=(32, 32, 3)) -> bytes:
    """A PNG of uniform random pixels (it compresses to about its raw size)."""
    return png(rng.integers(0, 256, shape, dtype=np.uint8))


def chunk(kind, data):
    """One PNG chunk: length, type, data, CRC."""
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


# The fixture's two prompts: one PNG; a system message and two images (PNG, JPEG) marked inline.
PROMPT0 = [{"role": "user", "content": [image_part(fixture_image("image_0.png")),
                                        {"type": "text", "text": "What is in this picture?"}]}]
PROMPT1 = [
    {"role": "system", "content": "You compare pictures."},
    {"role": "user", "content": [
        {"type": "text", "text": "Compare <|image|> with <|image|>. Which one is brighter?"},
        image_part(fixture_image("image_1.png")),
        image_part(fixture_image("image_2.jpg"), mime="image/jpeg", detail="high")]},
]
# A Hugging Face style template: it iterates over content parts and writes the placeholder for
# {"type": "image"} parts itself; it renders PROMPT0 to the reference text.
HF_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{{ '<|' + message['role'] + '|>\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}{{ '<|image|>\\n' }}"
    "{% else %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}{{ eos_token + '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}")


def bad_images(url_case):
    """(id, content parts, fragment of the 400's message) for images any server refuses under
    LIMIT_ARGS; `url_case` is the case for an https URL, which depends on the server's fetch
    settings. The decompression bomb is case 5; noise_png(default_rng(7)) is the valid image
    the cases cut or repeat."""
    rng = np.random.default_rng(7)
    whole = noise_png(rng)
    bomb = (b"\x89PNG\r\n\x1a\n" +
            chunk(b"IHDR", struct.pack(">IIBBBBB", 100000, 100000, 8, 2, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b""))
    svg = b'<?xml version="1.0"?><svg xmlns="http://www.w3.org/2000/svg" width="9" height="9"/>'
    return [
        ("truncated-png", [image_part(whole[:len(whole) // 2])], "truncated or corrupt PNG image"),
        ("not-an-image", [image_part(b"hello, these bytes are no picture at all")],
         "not a PNG, JPEG or WebP image"),
        ("svg", [image_part(svg, mime="image/svg+xml")], "SVG images are not supported"),
        ("over-pixel-limit", [image_part(png(np.zeros((1001, 1000, 3), dtype=np.uint8)))],
         f"over the limit of {MAX_PIXELS} pixels"),
        ("over-byte-limit", [image_part(noise_png(rng, (256, 256, 3)))],
         f"over the limit of {MAX_BYTES} bytes"),
        ("decompression-bomb", [image_part(bomb)], "decompression bomb"),
        url_case,
        ("too-many-images", [image_part(whole)] * 4, "At most 3 image(s)"),
        ("not-base64", [{"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}],
         "not valid base64"),
        # 1 x 5000: the shortest-edge resize before the crop would make 32 x 160,000 pixels.
        ("thin-strip", [image_part(png(np.zeros((1, 5000, 3), dtype=np.uint8)))],
         "image of 5000x1 pixels: its aspect ratio is too extreme"),
    ]
