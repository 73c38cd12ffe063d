#!/usr/bin/env python3
"""TTFT of image chats, 1 and 5 images per prompt, new images (encoder cache misses) and
repeated ones (hits): on `sluice serve` (aggregated: the image encoder runs in the serving
process), through the router with a separate encoder (router + `sluice encoder` + prefill +
decode processes on loopback, tests/integration/sluice_cluster.py), through the router without
an encoder (mode selfencode: the prefill and decode workers encode the images themselves), or on
a running endpoint.

    .venv/bin/python bench/vision_ttft.py --model ../shared/fixtures/llava-tiny \
        [--modes serve,disagg,selfencode] [--endpoint URL] [--sluice build/bin/sluice] [--requests 30] \
        [--image-size 640x480] [--worker-args ARGS] [--encoder-args ARGS] [--out FILE]

On a GPU with LLaVA-1.5-7B shapes and dummy weights (CLIP ViT-L/14-336 + a 7B Llama, both on
the GPU; only config.json and preprocessor_config.json exist there, so a byte-level BPE of the
config's vocab_size with `<image>` at image_token_index and a plain USER/ASSISTANT chat template
are written beside a copy of them):

    .venv/bin/python bench/vision_ttft.py --model bench/configs/llava-1.5-7b --modes serve \
        --worker-args "--device cuda --load-format dummy" --requests 20 --out FILE

--worker-args go to `sluice serve` and to the prefill / decode workers, --encoder-args to
`sluice encoder` (e.g. "--device cuda --load-format dummy").

Each request is a streamed greedy chat (max_tokens 1) whose user message holds k JPEG images of
`--image-size` (random noise, so decoding and the antialiased resize do real work) and a short
question; TTFT is the time from sending to the first content chunk, measured with the openai
SDK one request at a time. "miss" requests use fresh images; "hit" requests repeat the first
request's images (embeddings from the cache; the prefix cache may also hit). Prints and writes
JSON: per mode and (k, miss|hit) the median and p90 TTFT in seconds, the encoder's share of
TTFT (median over requests of the wall time the process that encodes the images spent decoding
and encoding them during the request, from its /metrics counter, over that request's TTFT:
`sluice serve`'s sluice_image_encode_seconds_total, the encoder worker's
sluice_encoder_encode_seconds_total, or the workers' sluice_worker_image_encode_seconds_total;
with `encode_median_s`, the time itself), the ratio of 5-image to
1-image median TTFT, and the disaggregated / aggregated median ratios of each router mode.
`--endpoint URL` measures a server already running there instead (mode "endpoint").
"""
import argparse
import base64
import io
import json
import os
import pathlib
import shlex
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request

import numpy as np
import openai
from PIL import Image

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "e2e"))
from conftest import ServerProcess  # noqa: E402


def jpeg(rng, w, h) -> str:
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(out, "JPEG", quality=90)
    return "data:image/jpeg;base64," + base64.b64encode(out.getvalue()).decode()


def ttft(client, model, urls) -> float:
    content = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    content.append({"type": "text", "text": "What is in these pictures?"})
    start = time.perf_counter()
    stream = client.chat.completions.create(model=model, stream=True, temperature=0, max_tokens=1,
                                            messages=[{"role": "user", "content": content}])
    first = None
    for chunk in stream:
        # The first chunk may carry only the role (content ""): time the first text.
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter() - start
    return first if first is not None else time.perf_counter() - start


def metric_sum(sources) -> float | None:
    """The sum of each (metrics URL, counter name) of `sources`; None when one is missing."""
    total = 0.0
    for url, name in sources:
        with urllib.request.urlopen(url, timeout=10) as r:
            values = [float(line.split()[1]) for line in r.read().decode().splitlines()
                      if line.startswith(name + " ")]
        if not values:
            return None
        total += values[0]
    return total


def measure(client, model, args, rng, encode_sources):
    """Per (k, miss|hit): TTFT median / p90, and from `encode_sources` (the counters of wall
    time spent decoding and encoding images where this mode encodes them, read around each
    request; requests run one at a time) the encode time per request and its share of that
    request's TTFT, medians."""
    w, h = (int(x) for x in args.image_size.split("x"))
    out = {}
    ttft(client, model, [jpeg(rng, w, h)])  # warm-up
    for k in (1, 5):
        repeated = [jpeg(rng, w, h) for _ in range(k)]
        for kind in ("miss", "hit"):
            times, encode, share = [], [], []
            for _ in range(args.requests):
                urls = repeated if kind == "hit" else [jpeg(rng, w, h) for _ in range(k)]
                before = metric_sum(encode_sources)
                t = ttft(client, model, urls)
                after = metric_sum(encode_sources)
                times.append(t)
                if before is not None and after is not None:
                    encode.append(after - before)
                    share.append((after - before) / t)
            times.sort()
            out[f"{k}_image_{kind}"] = {"median_s": statistics.median(times),
                                        "p90_s": times[int(0.9 * (len(times) - 1))]}
            if encode:
                out[f"{k}_image_{kind}"].update({
                    "encode_median_s": statistics.median(encode),
                    "encoder_share_of_ttft_median": statistics.median(share)})
    out["ratio_5_to_1_miss"] = out["5_image_miss"]["median_s"] / out["1_image_miss"]["median_s"]
    out["ratio_miss_to_hit_5"] = out["5_image_miss"]["median_s"] / out["5_image_hit"]["median_s"]
    return out


SERVER_ARGS = ["--limit-mm-per-prompt", "image=5", "--max-image-bytes", str(64 << 20)]

# A chat template taking string content (images become `<image>` placeholders in the text).
CHAT_TEMPLATE = ("{%- for message in messages -%}"
                 "{%- if message['role'] == 'user' -%}{{- 'USER: ' -}}"
                 "{%- else -%}{{- 'ASSISTANT: ' -}}{%- endif -%}"
                 "{{- message['content'] + '\\n' -}}"
                 "{%- endfor -%}"
                 "{%- if add_generation_prompt -%}{{- 'ASSISTANT:' -}}{%- endif -%}")


def model_folder(config_dir: pathlib.Path) -> pathlib.Path:
    """`config_dir` itself when it has a tokenizer; else a temporary copy of its config.json and
    preprocessor_config.json with a byte-level BPE of text_config.vocab_size tokens whose id
    image_token_index is the special token `<image>`, and CHAT_TEMPLATE (dummy-weight runs)."""
    if (config_dir / "tokenizer.json").exists():
        return config_dir
    sys.path.insert(0, str(REPO / "bench"))
    from disagg_serving_bench import write_tokenizer  # noqa: E402
    d = pathlib.Path(tempfile.mkdtemp(prefix="sluice-vision-ttft-")) / config_dir.name
    d.mkdir()
    for name in ("config.json", "preprocessor_config.json"):
        shutil.copy(config_dir / name, d / name)
    config = json.loads((d / "config.json").read_text())
    vocab_size = config["text_config"]["vocab_size"]
    image_id = config["image_token_index"]
    write_tokenizer(d / "tokenizer.json", vocab_size)
    tok = json.loads((d / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    old = next(s for s, i in vocab.items() if i == image_id)
    # write_tokenizer adds merge k with token 256 + k; nothing merges its 3-symbol tokens further.
    if image_id < 256 or len(old) != 3:
        raise ValueError(f"image_token_index {image_id} is not a 3-symbol merge of the BPE")
    del tok["model"]["merges"][image_id - 256]
    del vocab[old]
    vocab["<image>"] = image_id
    tok["added_tokens"] = [{"id": image_id, "content": "<image>", "single_word": False,
                            "lstrip": False, "rstrip": False, "normalized": False,
                            "special": True}]
    (d / "tokenizer.json").write_text(json.dumps(tok))
    (d / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    return d


def start(mode, model_dir, worker_args, encoder_args, decode_args=()):
    """(url, stop, encode_sources) of a fresh server for `mode`: encode_sources are the
    (metrics URL, counter) pairs of wall time spent decoding and encoding images where the mode
    encodes them (the server, the encoder worker, or the prefill and decode workers)."""
    if mode == "serve":
        server = ServerProcess(extra_args=SERVER_ARGS + worker_args, model_dir=model_dir)
        return server.url, server.stop, [(server.url + "/metrics",
                                          "sluice_image_encode_seconds_total")]
    sys.path.insert(0, str(REPO / "tests" / "integration"))
    from sluice_cluster import Cluster  # noqa: E402
    cluster = Cluster(1, 1, num_encoder=1 if mode == "disagg" else 0, model_dir=model_dir,
                      router_args=SERVER_ARGS, worker_args=worker_args,
                      role_args={"encoder": ["--max-image-bytes", str(64 << 20), *encoder_args],
                                 "decode": list(decode_args)})
    if mode == "disagg":
        sources = [(cluster.metrics_urls["encoder-0"], "sluice_encoder_encode_seconds_total")]
    else:
        sources = [(cluster.metrics_urls[w], "sluice_worker_image_encode_seconds_total")
                   for w in ("prefill-0", "decode-0")]
    return cluster.url, cluster.stop, sources


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--sluice", default=str(REPO / "build" / "bin" / "sluice"))
    ap.add_argument("--modes", default="serve,disagg",
                    help="serve (aggregated), disagg (router + encoder + prefill + decode), "
                         "selfencode (router + prefill + decode, the workers encode)")
    ap.add_argument("--endpoint", help="measure the server at this URL instead")
    ap.add_argument("--requests", type=int, default=30)
    ap.add_argument("--image-size", default="640x480")
    ap.add_argument("--worker-args", default="",
                    help="extra flags of sluice serve and the prefill/decode workers, e.g. "
                         "'--device cuda --load-format dummy'")
    ap.add_argument("--encoder-args", default="", help="extra flags of sluice encoder")
    ap.add_argument("--decode-args", default="",
                    help="extra flags of the decode worker (disagg, selfencode), e.g. "
                         "'--test-reserve-answer-delay-ms 50'")
    ap.add_argument("--out")
    args = ap.parse_args()
    os.environ["SLUICE_BIN"] = args.sluice
    model = pathlib.Path(args.model).name
    worker_args, encoder_args = shlex.split(args.worker_args), shlex.split(args.encoder_args)
    decode_args = shlex.split(args.decode_args)
    result = {"model": args.model, "image_size": args.image_size, "requests": args.requests,
              "worker_args": args.worker_args, "encoder_args": args.encoder_args,
              "decode_args": args.decode_args,
              "cpu_threads": os.environ.get("SLUICE_CPU_THREADS", "default"), "ttft": {}}
    modes = ["endpoint"] if args.endpoint else args.modes.split(",")
    for mode in modes:
        if mode == "endpoint":
            # A `sluice serve` endpoint reports its encode time; other servers: TTFT only.
            url, stop = args.endpoint, (lambda: None)
            sources = [(url + "/metrics", "sluice_image_encode_seconds_total")]
            try:
                metric_sum(sources)
            except OSError:
                sources = []
        else:
            url, stop, sources = start(mode, model_folder(pathlib.Path(args.model)),
                                       worker_args, encoder_args, decode_args)
        try:
            client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
            result["ttft"][mode] = measure(client, model, args, np.random.default_rng(26),
                                           sources)
        finally:
            stop()
    t = result["ttft"]
    for routed in ("disagg", "selfencode"):
        if "serve" in t and routed in t:
            result[f"ratio_{routed}_to_serve"] = {
                key: t[routed][key]["median_s"] / t["serve"][key]["median_s"]
                for key in t["serve"] if isinstance(t["serve"][key], dict)}
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        pathlib.Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
