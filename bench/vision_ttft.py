#!/usr/bin/env python3
"""TTFT of image chats, 1 and 5 images per prompt, new images (encoder cache misses) and
repeated ones (hits): on `sluice serve` (aggregated: the image encoder runs in the serving
process), through the router with a separate encoder (router + `sluice encoder` + prefill +
decode processes on loopback, tests/integration/sluice_cluster.py), through the router without
an encoder (mode selfencode: the prefill and decode workers encode the images themselves), or on
a running endpoint.

    .venv/bin/python bench/vision_ttft.py --model ../shared/fixtures/llava-tiny \
        [--modes serve,disagg,selfencode] [--endpoint URL] [--sluice build/bin/sluice] [--requests 30] \
        [--image-size 640x480] [--out FILE]

Each request is a streamed greedy chat (max_tokens 1) whose user message holds k JPEG images of
`--image-size` (random noise, so decoding and the antialiased resize do real work) and a short
question; TTFT is the time from sending to the first content chunk, measured with the openai
SDK one request at a time. "miss" requests use fresh images; "hit" requests repeat the first
request's images (embeddings from the cache; the prefix cache may also hit). Prints and writes
JSON: per mode and (k, miss|hit) the median and p90 TTFT in seconds, the ratio of 5-image to
1-image median TTFT, and the disaggregated / aggregated median ratios of each router mode.
`--endpoint URL` measures a server already running there instead (mode "endpoint").
"""
import argparse
import base64
import io
import json
import os
import pathlib
import statistics
import sys
import time

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
        if first is None and chunk.choices and chunk.choices[0].delta.content is not None:
            first = time.perf_counter() - start
    return first if first is not None else time.perf_counter() - start


def measure(client, model, args, rng):
    w, h = (int(x) for x in args.image_size.split("x"))
    out = {}
    ttft(client, model, [jpeg(rng, w, h)])  # warm-up
    for k in (1, 5):
        repeated = [jpeg(rng, w, h) for _ in range(k)]
        for kind in ("miss", "hit"):
            times = []
            for _ in range(args.requests):
                urls = repeated if kind == "hit" else [jpeg(rng, w, h) for _ in range(k)]
                times.append(ttft(client, model, urls))
            times.sort()
            out[f"{k}_image_{kind}"] = {"median_s": statistics.median(times),
                                        "p90_s": times[int(0.9 * (len(times) - 1))]}
    out["ratio_5_to_1_miss"] = out["5_image_miss"]["median_s"] / out["1_image_miss"]["median_s"]
    out["ratio_miss_to_hit_5"] = out["5_image_miss"]["median_s"] / out["5_image_hit"]["median_s"]
    return out


SERVER_ARGS = ["--limit-mm-per-prompt", "image=5", "--max-image-bytes", str(64 << 20)]


def start(mode, model_dir):
    """(url, stop) of a fresh server for `mode`."""
    if mode == "serve":
        server = ServerProcess(extra_args=SERVER_ARGS, model_dir=model_dir)
        return server.url, server.stop
    sys.path.insert(0, str(REPO / "tests" / "integration"))
    from sluice_cluster import Cluster  # noqa: E402
    cluster = Cluster(1, 1, num_encoder=1 if mode == "disagg" else 0, model_dir=model_dir,
                      router_args=SERVER_ARGS,
                      role_args={"encoder": ["--max-image-bytes", str(64 << 20)]})
    return cluster.url, cluster.stop


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
    ap.add_argument("--out")
    args = ap.parse_args()
    os.environ["SLUICE_BIN"] = args.sluice
    model = pathlib.Path(args.model).name
    result = {"model": args.model, "image_size": args.image_size, "requests": args.requests,
              "cpu_threads": os.environ.get("SLUICE_CPU_THREADS", "default"), "ttft": {}}
    modes = ["endpoint"] if args.endpoint else args.modes.split(",")
    for mode in modes:
        if mode == "endpoint":
            url, stop = args.endpoint, (lambda: None)
        else:
            url, stop = start(mode, pathlib.Path(args.model))
        try:
            client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
            result["ttft"][mode] = measure(client, model, args, np.random.default_rng(26))
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
