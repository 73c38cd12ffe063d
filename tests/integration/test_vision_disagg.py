"""Images through the router (issue 26): router + encoder + prefill + decode processes on
../shared/fixtures/llava-tiny give the reference greedy tokens (the same as `sluice serve`, see
tests/e2e/test_vision.py), over HTTP (both chat-template conventions, streaming) and gRPC; the
encoder pool's cache and the prefill worker's prefix cache key on image content; bad images get
the same 400s as `sluice serve` from the router; the router fetches allowed http image URLs;
a decode worker that prefills itself gets the embeddings too; an encoder killed mid-request
fails over to another, and with none left (or none registered) the prefill worker encodes the
images itself with the same output, off its gRPC and engine threads, while the decode worker
encodes them only when it recomputes the prompt; a repeated image is decoded by the router only
once; SIGTERM of each encoder in turn under image load (a rolling restart of the encoder pool,
issue 22) fails no request."""

import http.server
import json
import math
import signal
import threading
import time

import numpy as np
import openai
import pytest
from tokenizers import Tokenizer

from llava_tiny import (FIXTURE, HF_TEMPLATE, LIMIT_ARGS, PROMPT0, PROMPT1,
                        bad_images as common_bad_images, fixture_image, golden, image_part, png,
                        want_text)
from sluice_cluster import Cluster, Serve, http_get, sum_samples, wait_until

WORKER_ARGS = ["--max-model-len", "256"]

pytestmark = pytest.mark.skipif(not FIXTURE.exists(), reason="llava-tiny fixture not found")


def chat(client, messages, max_tokens=32, **kw):
    return client.chat.completions.create(model="llava-tiny", messages=messages, temperature=0,
                                          max_tokens=max_tokens, **kw)


def client_of(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="sk-unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer.from_file(str(FIXTURE / "tokenizer.json"))


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(1, 1, num_encoder=2, model_dir=FIXTURE, worker_args=WORKER_ARGS,
                router_args=[*LIMIT_ARGS, "--allowed-media-domains", "127.0.0.1"])
    yield c
    c.stop()


@pytest.fixture(scope="module")
def routed(cluster):
    return client_of(cluster.url)


@pytest.mark.parametrize("case,messages,extra", [
    (0, PROMPT0, {}),
    (1, PROMPT1, {}),
    (0, PROMPT0, {"extra_body": {"chat_template": HF_TEMPLATE}}),
], ids=["one-png", "system-png-jpeg-inline", "hf-content-parts"])
def test_reference_greedy_tokens_through_the_router(routed, cluster, tokenizer, case, messages,
                                                    extra):
    remote = cluster.metric('sluice_router_prefills_total{where="remote"}')
    images = cluster.metric("sluice_router_encoded_images_total")
    reply = chat(routed, messages, **extra)
    assert reply.choices[0].message.content == want_text(tokenizer, case)
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.prompt_tokens == len(golden(f"input_ids_{case}"))
    # Encoded by the encoder pool, prefilled on the prefill worker.
    assert cluster.metric("sluice_router_encoded_images_total") == images + (2 if case else 1)
    assert cluster.metric('sluice_router_prefills_total{where="remote"}') == remote + 1


def test_streaming_with_an_image(routed, tokenizer):
    stream = routed.chat.completions.create(model="llava-tiny", messages=PROMPT0, temperature=0,
                                            max_tokens=32, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == want_text(tokenizer, 0)


def test_same_output_as_sluice_serve_for_new_images(routed):
    rng = np.random.default_rng(2626)
    messages = [{"role": "user", "content": [
        image_part(png(rng.integers(0, 256, (48, 40, 3), dtype=np.uint8))),
        {"type": "text", "text": "Tell me about it."},
        image_part(png(rng.integers(0, 256, (24, 24, 3), dtype=np.uint8)))]}]
    serve = Serve(model_dir=FIXTURE, args=LIMIT_ARGS)
    try:
        want = chat(client_of(serve.url), messages, max_tokens=24)
    finally:
        serve.stop()
    got = chat(routed, messages, max_tokens=24)
    assert got.choices[0].message.content == want.choices[0].message.content
    assert got.usage.prompt_tokens == want.usage.prompt_tokens


def encoder_counter(cluster, name):
    return sum(cluster.worker_metric(w, name) for w in cluster.workers if w.startswith("encoder"))


def test_same_image_hits_the_encoder_cache_and_the_prefix_cache(routed, cluster):
    image = png(np.full((40, 50, 3), 91, dtype=np.uint8))
    messages = [{"role": "user", "content": [image_part(image),
                                             {"type": "text", "text": "Describe it, please."}]}]
    first = chat(routed, messages)
    hits = encoder_counter(cluster, "sluice_encoder_cache_hits_total")
    misses = encoder_counter(cluster, "sluice_encoder_cache_misses_total")
    # The second time goes to the encoder that has it (cache affinity on the image hash).
    second = chat(routed, messages)
    assert second.choices[0].message.content == first.choices[0].message.content
    # The prefill worker's prefix cache keys on the image: its blocks are reused.
    assert second.usage.prompt_tokens_details.cached_tokens >= 16
    assert encoder_counter(cluster, "sluice_encoder_cache_hits_total") == hits + 1
    assert encoder_counter(cluster, "sluice_encoder_cache_misses_total") == misses


def test_different_images_give_different_outputs_and_share_no_blocks(routed):
    def ask(pixels):
        return chat(routed, [{"role": "user", "content": [
            image_part(png(pixels)), {"type": "text", "text": "What colour is this?"}]}])

    rng = np.random.default_rng(126)
    a = ask(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8))
    b = ask(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8))
    assert a.choices[0].message.content != b.choices[0].message.content
    # The image starts inside the first KV block: nothing of b's prompt is cached from a.
    assert b.usage.prompt_tokens_details.cached_tokens == 0


def bad_images():
    return common_bad_images(
        ("url-off-the-allow-list",
         [{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}],
         "the host 'example.com' is not in --allowed-media-domains"))


@pytest.mark.parametrize("name,parts,fragment", bad_images(), ids=[c[0] for c in bad_images()])
def test_bad_images_are_the_same_400s_as_serve(routed, cluster, tokenizer, name, parts, fragment):
    images = cluster.metric("sluice_router_encoded_images_total")
    with pytest.raises(openai.BadRequestError) as err:
        chat(routed, [{"role": "user", "content": parts + [{"type": "text", "text": "Hi"}]}])
    assert err.value.status_code == 400
    assert fragment in err.value.message, err.value.message
    assert cluster.metric("sluice_router_encoded_images_total") == images  # refused at the router
    assert chat(routed, PROMPT0).choices[0].message.content == want_text(tokenizer, 0)


def test_grpc_generate_with_images_through_the_router(cluster):
    import grpc
    from grpc_stubs import common, pb, pb_grpc  # generated from proto/ at import
    stub = pb_grpc.InferenceStub(grpc.insecure_channel(f"127.0.0.1:{cluster.grpc_port}"))
    prompt = pb.ChatPrompt(add_generation_prompt=True, messages=[
        pb.ChatMessage(role="system", content="You compare pictures."),
        pb.ChatMessage(role="user", parts=[
            pb.ContentPart(text="Compare <|image|> with <|image|>. Which one is brighter?"),
            pb.ContentPart(image=pb.ImagePart(data=fixture_image("image_1.png"))),
            pb.ContentPart(image=pb.ImagePart(data=fixture_image("image_2.jpg"))),
        ])])
    request = pb.GenerateRequest(chat=prompt, detokenize=True,
                                 sampling=common.SamplingParams(temperature=0, max_tokens=32))
    ids = [t.token_id for out in stub.Generate(request, timeout=60) for t in out.tokens]
    assert ids == golden("greedy_1").tolist()


def test_image_url_fetched_by_the_router(routed, cluster, tokenizer):
    image = fixture_image("image_0.png")

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            self.send_response(200 if self.path == "/image_0.png" else 404)
            self.send_header("Content-Length", str(len(image) if self.path == "/image_0.png" else 0))
            self.end_headers()
            if self.path == "/image_0.png":
                self.wfile.write(image)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        images = cluster.metric("sluice_router_encoded_images_total")
        messages = [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": base + "/image_0.png"}},
            {"type": "text", "text": "What is in this picture?"}]}]
        assert chat(routed, messages).choices[0].message.content == want_text(tokenizer, 0)
        assert cluster.metric("sluice_router_encoded_images_total") == images + 1
        messages[0]["content"][0]["image_url"]["url"] = base + "/gone.png"
        with pytest.raises(openai.BadRequestError) as err:
            chat(routed, messages)
        assert "cannot fetch the image URL: the image URL answered HTTP 404" in err.value.message
    finally:
        server.shutdown()


def test_router_checks_a_repeated_image_once(routed, cluster):
    """Multi-turn chat: every turn resends the picture; the router decodes it only the first
    time (its record of checked images, by content hash), and the answer stays the same."""
    image = png(np.full((30, 36, 3), 140, dtype=np.uint8))
    turn1 = [{"role": "user", "content": [image_part(image),
                                          {"type": "text", "text": "What is it?"}]}]
    cached = cluster.metric("sluice_router_image_checks_cached_total")
    decoded = cluster.metric("sluice_router_image_checks_decoded_total")
    first = chat(routed, turn1, max_tokens=8)
    assert cluster.metric("sluice_router_image_checks_decoded_total") == decoded + 1
    assert cluster.metric("sluice_router_image_checks_cached_total") == cached
    turn2 = turn1 + [{"role": "assistant", "content": first.choices[0].message.content},
                     {"role": "user", "content": [image_part(image),
                                                  {"type": "text", "text": "And now?"}]}]
    chat(routed, turn2, max_tokens=8)
    assert cluster.metric("sluice_router_image_checks_cached_total") == cached + 2
    again = chat(routed, turn1, max_tokens=8)
    assert again.choices[0].message.content == first.choices[0].message.content
    assert cluster.metric("sluice_router_image_checks_cached_total") == cached + 3
    assert cluster.metric("sluice_router_image_checks_decoded_total") == decoded + 1


def test_planner_sizes_the_encoder_pool(routed, cluster):
    """GET /v1/planner has an encoder pool for a vision model: image requests counted at arrival
    with their images, the per-call / per-image cost fitted from the encoders' heartbeats, the
    encoders' cache hit rate, and the replicas that follow from them (also on /metrics)."""
    rng = np.random.default_rng(3030)
    for _ in range(2):
        chat(routed, [{"role": "user", "content": [
            image_part(png(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8))),
            image_part(png(rng.integers(0, 256, (20, 28, 3), dtype=np.uint8))),
            {"type": "text", "text": "Compare them."}]}], max_tokens=4)

    def encoder_plan():
        page = json.loads(http_get(cluster.url + "/v1/planner")[1])
        return page, {p["pool"]: p for p in page["pools"]}.get("encoder")

    wait_until(lambda: encoder_plan()[1]["explanation"]["cost_model"]["steps_observed"] > 0, 15,
               "the encoders' Encode calls in their heartbeats")
    page, plan = encoder_plan()
    assert [p["pool"] for p in page["pools"]] == ["prefill", "decode", "encoder"]
    assert plan["current_replicas"] == 2
    e = plan["explanation"]
    w = e["workload"]
    assert w["image_requests_in_window"] >= 2 and w["image_request_rate_rps"] > 0
    assert 1 <= w["mean_images_per_image_request"] <= 3
    assert 0 <= e["cache_hit_rate"] < 1
    cost = e["cost_model"]
    assert cost["fixed_seconds"] >= 0 and cost["per_token_seconds"] >= 0
    assert cost["fixed_seconds"] + cost["per_token_seconds"] > 0
    images = w["mean_images_per_image_request"] * (1 - e["cache_hit_rate"])
    assert e["images_encoded_per_request"] == pytest.approx(images, rel=1e-9)
    s = cost["fixed_seconds"] + cost["per_token_seconds"] * images
    assert e["encode_seconds_per_request"] == pytest.approx(s, rel=1e-9)
    budget = page["slo"]["ttft_seconds"] * page["slo"]["encode_share"]
    assert e["ttft_budget_seconds"] == pytest.approx(budget)
    if e["slo_feasible"]:
        rho = 2 * (budget - s) / (2 * (budget - s) + s)
        assert plan["desired_replicas"] == max(
            1, math.ceil(w["image_request_rate_rps"] * s / rho - 1e-9))
    # Prefill plans within the rest of the TTFT SLO.
    prefill = {p["pool"]: p for p in page["pools"]}["prefill"]["explanation"]
    assert prefill["ttft_budget_seconds"] == pytest.approx(page["slo"]["ttft_seconds"] - budget)
    metrics = http_get(cluster.url + "/metrics")[1]
    assert 'sluice_planner_desired_replicas{pool="encoder"} ' in metrics
    assert 'sluice_planner_current_replicas{pool="encoder"} 2' in metrics


def test_without_encoders_the_workers_encode_images_themselves(tokenizer):
    """No encoder worker registered: the router sends the images as bytes and the prefill
    worker encodes them with its own vision tower — the same greedy token ids as the encoder
    pool (the goldens, which test_grpc_generate_with_images_through_the_router checks on the
    pool); a repeated image comes from the worker's embedding cache. The decode worker, which
    receives the prompt's KV, encodes nothing."""
    import grpc
    from test_router_grpc import common, pb, pb_grpc
    c = Cluster(1, 1, model_dir=FIXTURE, worker_args=WORKER_ARGS, router_args=LIMIT_ARGS)
    try:
        client = client_of(c.url)
        reply = chat(client, PROMPT1)
        assert reply.choices[0].message.content == want_text(tokenizer, 1)
        assert c.metric("sluice_router_self_encoded_images_total") == 2
        assert c.metric("sluice_router_encoded_images_total") == 0
        assert c.metric('sluice_router_prefills_total{where="remote"}') == 1
        assert c.worker_metric("prefill-0", "sluice_worker_images_encoded_total") == 2
        assert c.worker_metric("decode-0", "sluice_worker_images_encoded_total") == 0
        stub = pb_grpc.InferenceStub(grpc.insecure_channel(f"127.0.0.1:{c.grpc_port}"))
        prompt = pb.ChatPrompt(add_generation_prompt=True, messages=[
            pb.ChatMessage(role="system", content="You compare pictures."),
            pb.ChatMessage(role="user", parts=[
                pb.ContentPart(text="Compare <|image|> with <|image|>. Which one is brighter?"),
                pb.ContentPart(image=pb.ImagePart(data=fixture_image("image_1.png"))),
                pb.ContentPart(image=pb.ImagePart(data=fixture_image("image_2.jpg"))),
            ])])
        request = pb.GenerateRequest(chat=prompt,
                                     sampling=common.SamplingParams(temperature=0, max_tokens=32))
        ids = [t.token_id for out in stub.Generate(request, timeout=60) for t in out.tokens]
        assert ids == golden("greedy_1").tolist()
        # The second time both images came from the prefill worker's cache (encoded once), and
        # its prefix cache reused the blocks keyed by their content hashes.
        assert c.worker_metric("prefill-0", "sluice_worker_images_encoded_total") == 2
        assert c.worker_metric("prefill-0", "sluice_encoder_cache_hits_total") >= 2
        assert c.metric("sluice_router_image_checks_cached_total") == 2
        reply = chat(client, PROMPT0)
        assert reply.choices[0].message.content == want_text(tokenizer, 0)
        assert c.metric("sluice_router_self_encoded_images_total") == 5
        assert c.worker_metric("prefill-0", "sluice_worker_images_encoded_total") == 3
        assert c.worker_metric("decode-0", "sluice_worker_images_encoded_total") == 0
    finally:
        c.stop()


def in_background(fn):
    """Runs fn() on a thread; returns the thread and a dict that gets "reply" or "error"."""
    result = {}

    def run():
        try:
            result["reply"] = fn()
        except Exception as e:  # noqa: BLE001 - checked by the caller
            result["error"] = e
    t = threading.Thread(target=run)
    t.start()
    return t, result


def test_an_image_encoding_on_the_prefill_worker_does_not_hold_up_text(tokenizer):
    """The prefill worker encodes images on its own threads, never on its gRPC handlers or its
    engine thread: while an image is held 6 s in its encode (test delay), a text request sent
    after it is served to the end, with the same text as when the worker is idle; the image
    request ends after it, with the reference text. Only the prefill worker encodes."""
    c = Cluster(1, 1, model_dir=FIXTURE, worker_args=WORKER_ARGS, router_args=LIMIT_ARGS,
                role_args={"prefill": ["--test-image-encode-delay-ms", "6000"]})
    client = client_of(c.url)
    hello = [{"role": "user", "content": "Hello"}]

    def encoding():
        return c.worker_metric("prefill-0", "sluice_worker_image_encodes_running")
    try:
        t, result = in_background(lambda: chat(client, PROMPT0))
        wait_until(lambda: encoding() == 1, 30, "the image encoding on the prefill worker",
                   interval=0.05)
        text = chat(client, hello, max_tokens=8)
        # The text request ended first: the image request is still encoding.
        assert "reply" not in result and "error" not in result, result
        assert encoding() == 1
        t.join(120)
        assert "error" not in result, result
        assert result["reply"].choices[0].message.content == want_text(tokenizer, 0)
        assert encoding() == 0
        assert chat(client, hello, max_tokens=8).choices[0].message.content == \
            text.choices[0].message.content
        assert c.worker_metric("prefill-0", "sluice_worker_images_encoded_total") == 1
        assert c.worker_metric("decode-0", "sluice_worker_images_encoded_total") == 0
    finally:
        c.stop()


def test_decode_encodes_images_only_when_it_recomputes_the_prompt(tokenizer):
    """The decode worker pulls only after the prefill worker's pin expired (1 s pin, decode
    start held 3 s by the router's test delay), so it recomputes the prompt: then, and only
    then, it needs the embeddings, and encodes them from the bytes it kept. The reference
    tokens either way."""
    import grpc
    from test_router_grpc import common, pb, pb_grpc
    c = Cluster(1, 1, model_dir=FIXTURE, worker_args=WORKER_ARGS,
                router_args=[*LIMIT_ARGS, "--test-decode-start-delay-ms", "3000"],
                role_args={"prefill": ["--kv-pin-timeout-s", "1"]})
    try:
        stub = pb_grpc.InferenceStub(grpc.insecure_channel(f"127.0.0.1:{c.grpc_port}"))
        prompt = pb.ChatPrompt(add_generation_prompt=True, messages=[
            pb.ChatMessage(role="system", content="You compare pictures."),
            pb.ChatMessage(role="user", parts=[
                pb.ContentPart(text="Compare <|image|> with <|image|>. Which one is brighter?"),
                pb.ContentPart(image=pb.ImagePart(data=fixture_image("image_1.png"))),
                pb.ContentPart(image=pb.ImagePart(data=fixture_image("image_2.jpg"))),
            ])])
        request = pb.GenerateRequest(chat=prompt,
                                     sampling=common.SamplingParams(temperature=0, max_tokens=32))
        ids = [t.token_id for out in stub.Generate(request, timeout=60) for t in out.tokens]
        assert ids == golden("greedy_1").tolist()
        decode = c.worker_metrics_text("decode-0")
        assert sum_samples(decode, 'sluice_decode_recomputes_total{reason="pin_gone"}') == 1
        assert c.worker_metric("prefill-0", "sluice_worker_images_encoded_total") == 2
        assert c.worker_metric("decode-0", "sluice_worker_images_encoded_total") == 2
    finally:
        c.stop()


def test_decode_worker_prefills_images_itself(tokenizer):
    """No prefill worker: the decode worker prefills, with the embeddings the router sent."""
    c = Cluster(0, 1, num_encoder=1, model_dir=FIXTURE, worker_args=WORKER_ARGS,
                router_args=LIMIT_ARGS)
    try:
        reply = chat(client_of(c.url), PROMPT1)
        assert reply.choices[0].message.content == want_text(tokenizer, 1)
        assert c.metric('sluice_router_prefills_total{where="local"}') == 1
    finally:
        c.stop()


def test_decode_worker_prefilling_alone_encodes_the_images(tokenizer):
    """No prefill worker and no encoder: the decode worker prefills locally from the bytes,
    encoding the images on its encode threads (through its engine), with the reference text."""
    c = Cluster(0, 1, model_dir=FIXTURE, worker_args=WORKER_ARGS, router_args=LIMIT_ARGS)
    try:
        reply = chat(client_of(c.url), PROMPT1)
        assert reply.choices[0].message.content == want_text(tokenizer, 1)
        assert c.metric('sluice_router_prefills_total{where="local"}') == 1
        assert c.metric("sluice_router_self_encoded_images_total") == 2
        assert c.worker_metric("decode-0", "sluice_worker_images_encoded_total") == 2
        assert c.worker_metric("decode-0", "sluice_worker_image_encodes_running") == 0
    finally:
        c.stop()


def test_encoder_killed_mid_request_fails_over_then_the_workers_encode(tokenizer):
    c = Cluster(1, 1, num_encoder=2, model_dir=FIXTURE, worker_args=WORKER_ARGS,
                router_args=LIMIT_ARGS, role_args={"encoder": ["--test-encode-delay-ms", "1500"]})
    client = client_of(c.url)
    encoders = ["encoder-0", "encoder-1"]

    def kill_the_busy_encoder():
        busy = []

        def found():
            busy[:] = [e for e in encoders if c.workers[e].proc.poll() is None and
                       c.worker_metric(e, "sluice_encoder_requests_running") > 0]
            return busy
        wait_until(found, 30, "an encoder busy with the request", interval=0.05)
        c.workers[busy[0]].kill9()
        encoders.remove(busy[0])

    try:
        # 1. The encoder holding the images dies: another encoder takes them.
        t, result = in_background(lambda: chat(client, PROMPT0))
        kill_the_busy_encoder()
        t.join(120)
        assert "error" not in result, result
        assert result["reply"].choices[0].message.content == want_text(tokenizer, 0)
        assert c.metric('sluice_router_retries_total{stage="encode"}') >= 1
        # 2. The last encoder dies mid-request: the prefill worker encodes the image itself
        # (self-encode fallback), with the same output.
        t, result = in_background(lambda: chat(client, PROMPT0))
        kill_the_busy_encoder()
        t.join(120)
        assert "error" not in result, result
        assert result["reply"].choices[0].message.content == want_text(tokenizer, 0)
        assert c.metric("sluice_router_self_encoded_images_total") == 1
        # 3. None left: the same fallback at once; text still works.
        wait_until(lambda: not any(w["role"] == "encoder" for w in c.workers_json()), 30,
                   "the dead encoders removed")
        assert chat(client, PROMPT1).choices[0].message.content == want_text(tokenizer, 1)
        assert c.metric("sluice_router_self_encoded_images_total") == 3
        text = client.chat.completions.create(
            model="llava-tiny", messages=[{"role": "user", "content": "Hello"}], max_tokens=4,
            extra_body={"ignore_eos": True})  # a sampled EOS would end it early
        assert text.choices[0].finish_reason == "length"
    finally:
        c.stop()


def test_decode_reserves_while_the_encoder_runs_and_a_failed_encode_frees_it(tokenizer):
    """The router encodes the images while it picks the workers and reserves on decode: with
    each Encode held 3 s, the decode worker's blocks are reserved while the encoder still
    runs, and the prefill worker gets nothing before the embeddings (the reference text). An
    Encode the encoder refuses after that (two images, --max-images-per-call 1: RESOURCE_EXHAUSTED)
    fails the request with 429 as before, and the reservation is freed."""
    c = Cluster(1, 1, num_encoder=1, model_dir=FIXTURE, worker_args=WORKER_ARGS,
                router_args=LIMIT_ARGS,
                role_args={"encoder": ["--test-encode-delay-ms", "3000",
                                       "--max-images-per-call", "1"]})
    client = client_of(c.url)
    total = c.worker_metric("decode-0", "sluice_kv_cache_blocks")

    def decode_free():
        return c.worker_metric("decode-0", "sluice_kv_cache_free_blocks")
    try:
        t, result = in_background(lambda: chat(client, PROMPT0))
        wait_until(lambda: c.worker_metric("encoder-0", "sluice_encoder_requests_running") > 0,
                   30, "the encoder busy with the image", interval=0.02)
        # Well inside the 3 s encode, with room for a loaded machine's metric polls.
        wait_until(lambda: decode_free() < total, 2.0, "decode blocks reserved while encoding",
                   interval=0.02)
        assert c.worker_metric("encoder-0", "sluice_encoder_requests_running") == 1
        assert c.worker_metric("prefill-0", "sluice_worker_images_encoded_total") == 0
        t.join(120)
        assert "error" not in result, result
        assert result["reply"].choices[0].message.content == want_text(tokenizer, 0)
        assert c.metric("sluice_router_encoded_images_total") == 1
        assert c.metric("sluice_router_self_encoded_images_total") == 0
        assert c.worker_metric("prefill-0", "sluice_worker_images_encoded_total") == 0
        wait_until(lambda: decode_free() == total, 10, "decode blocks free")

        with pytest.raises(openai.RateLimitError, match="at most 1 images per call"):
            chat(client, PROMPT1)
        wait_until(lambda: decode_free() == total, 10, "the reservation freed")
        assert c.metric("sluice_router_self_encoded_images_total") == 0
    finally:
        c.stop()


def test_rolling_restart_of_the_encoder_pool_fails_nothing(tokenizer):
    """Issue 22 (SIGTERM of each kind of worker, rolling restart of every pool): while clients
    send image chats back to back (each Encode held 300 ms, so calls are in flight), each encoder
    in turn gets SIGTERM: it stops taking images, finishes those it holds, deregisters and exits
    0, and is started again before the next one goes. No request fails, every text is the
    reference's, and no image needed the workers' self-encode fallback."""
    c = Cluster(1, 1, num_encoder=2, model_dir=FIXTURE, worker_args=WORKER_ARGS,
                router_args=LIMIT_ARGS, role_args={"encoder": ["--test-encode-delay-ms", "300"]})
    client = client_of(c.url)
    stop = threading.Event()
    results = []  # (case, text or exception)
    lock = threading.Lock()

    def client_loop(k):
        n = 0
        while not stop.is_set():
            case = (k + n) % 2
            n += 1
            try:
                out = chat(client, PROMPT1 if case else PROMPT0).choices[0].message.content
            except Exception as e:  # noqa: BLE001 - every failure is reported below
                out = e
            with lock:
                results.append((case, out))

    threads = [threading.Thread(target=client_loop, args=(k,)) for k in range(3)]
    busy = {}  # encoder -> Encode calls it held when it got SIGTERM
    try:
        for t in threads:
            t.start()
        wait_until(lambda: len(results) >= 3, 120, "load under way")
        for name in ("encoder-0", "encoder-1"):
            worker = c.workers[name]
            # Catch it holding a call when affinity sends it any (else it drains idle).
            busy_by = time.monotonic() + 15
            busy[name] = c.worker_metric(name, "sluice_encoder_requests_running")
            while time.monotonic() < busy_by and busy[name] == 0:
                time.sleep(0.05)
                # The value seen is the one kept: a second read could miss a call ending.
                busy[name] = c.worker_metric(name, "sluice_encoder_requests_running")
            before = len(results)
            worker.proc.send_signal(signal.SIGTERM)
            assert worker.proc.wait(timeout=60) == 0, worker.tail()
            worker.log.close()
            worker.start()  # same flags, same address
            c.wait_registered(1, 1, num_encoder=2, timeout=120)
            wait_until(lambda: len(results) >= before + 3, 120, f"requests after {name}")
        stop.set()
        for t in threads:
            t.join(300)
        failed = [(case, out) for case, out in results if isinstance(out, Exception)]
        assert not failed, f"{len(failed)} of {len(results)} failed, e.g. {failed[0]}"
        wrong = [(case, out) for case, out in results if out != want_text(tokenizer, case)]
        assert not wrong, wrong[:2]
        assert c.metric("sluice_router_worker_failures_total") == 0
        assert c.metric("sluice_router_self_encoded_images_total") == 0
        # Under load: at least one encoder held calls as it got SIGTERM (cache affinity may
        # keep the other idle).
        assert sum(busy.values()) > 0, busy
        print(f"\nrolling restart of 2 encoders: {len(results)} image requests, 0 failed; "
              f"Encode calls held at SIGTERM: {busy}")
    finally:
        stop.set()
        for t in threads:
            t.join(300)
        c.stop()
