"""Embeddings handed from the encoder to prefill over UCX (issue 26): router + encoder + prefill
+ decode on ../shared/fixtures/llava-tiny with the encoder's inline threshold at 0, so every
image's embeddings wait in the encoder's registered staging arena and the prefill worker reads
them by RMA. The greedy text equals `sluice serve`'s (and the reference), the prefill worker
received every embedding byte by RMA and none inline, encoded nothing itself, and the encoder's
staging slots were all released, also for a repeat that reads nothing. With `sluice encoder --no-ucx` the same request gets the same
text over the inline path. A request the client abandons before prefill reads its embeddings
has its staging slots released by the router at once, not at the lease's end."""

import json
import re
import socket
import time

import openai
import pytest
from tokenizers import Tokenizer

from llava_tiny import FIXTURE, LIMIT_ARGS, PROMPT1, want_text
from sluice_cluster import Cluster, Serve, wait_until

pytestmark = pytest.mark.skipif(not FIXTURE.exists(), reason="llava-tiny fixture not found")

IMAGE_BYTES = 16 * 64 * 4  # llava-tiny: 16 placeholder tokens x 64 floats per image


def chat(url, messages):
    client = openai.OpenAI(base_url=url + "/v1", api_key="sk-unused", max_retries=0,
                           timeout=120)
    reply = client.chat.completions.create(model="llava-tiny", messages=messages,
                                           temperature=0, max_tokens=32)
    return reply.choices[0].message.content


def sample(cluster, worker, name, labels):
    """The value of the sample `name{labels}` on `worker`'s /metrics (0 if absent)."""
    pattern = rf"^{re.escape(name)}\{{{re.escape(labels)}\}} (\S+)$"
    for line in cluster.worker_metrics_text(worker).splitlines():
        m = re.match(pattern, line)
        if m:
            return float(m.group(1))
    return 0.0


@pytest.fixture(scope="module")
def serve_text():
    serve = Serve(model_dir=FIXTURE, args=LIMIT_ARGS)
    try:
        return chat(serve.url, PROMPT1)
    finally:
        serve.stop()


@pytest.mark.parametrize("encoder_args,path", [
    (["--embedding-inline-max-bytes", "0"], "rma"),
    (["--no-ucx"], "inline"),
], ids=["staged-rma", "no-ucx-inline"])
def test_embeddings_reach_prefill_by_rma(serve_text, encoder_args, path):
    tokenizer = Tokenizer.from_file(str(FIXTURE / "tokenizer.json"))
    assert serve_text == want_text(tokenizer, 1)
    cluster = Cluster(1, 1, num_encoder=1, model_dir=FIXTURE,
                      worker_args=["--max-model-len", "256"], router_args=LIMIT_ARGS,
                      role_args={"encoder": encoder_args})
    try:
        assert chat(cluster.url, PROMPT1) == serve_text
        byte_metric = "sluice_worker_embedding_bytes_total"
        rma = sample(cluster, "prefill-0", byte_metric, 'path="rma"')
        inline = sample(cluster, "prefill-0", byte_metric, 'path="inline"')
        # The prefill worker encoded nothing itself: both images' embeddings came from the
        # encoder, by the path under test.
        assert cluster.worker_metric("prefill-0", "sluice_worker_images_encoded_total") == 0
        enc_metric = "sluice_encoder_embedding_bytes_total"
        if path == "rma":
            assert rma == 2 * IMAGE_BYTES and inline == 0
            assert sample(cluster, "encoder-0", enc_metric, 'path="staged"') == 2 * IMAGE_BYTES
            assert sample(cluster, "encoder-0", enc_metric, 'path="inline"') == 0
            # The prefill worker's acks freed the slots (the decode worker never needed them).
            wait_until(lambda: cluster.worker_metric(
                "encoder-0", "sluice_encoder_staging_leases") == 0, timeout=10,
                       what="the staging slots released")
            assert sample(cluster, "encoder-0", "sluice_encoder_staging_leases_ended_total",
                          'end="released"') == 2
            assert cluster.worker_metric("encoder-0", "sluice_encoder_staging_bytes") == 0
            # Again: the prefill worker has the image cached (prefix or embedding cache) and reads
            # nothing; the slots are freed at once all the same (its release, or the router's
            # once prefill answered), not at the 30 s lease's end.
            assert chat(cluster.url, PROMPT1) == serve_text
            wait_until(lambda: cluster.worker_metric(
                "encoder-0", "sluice_encoder_staging_leases") == 0, timeout=10,
                what="the repeat's staging slots released")
            assert sample(cluster, "prefill-0", byte_metric, 'path="rma"') == 2 * IMAGE_BYTES
            assert sample(cluster, "encoder-0", "sluice_encoder_staging_leases_ended_total",
                          'end="released"') == 4
            assert sample(cluster, "encoder-0", "sluice_encoder_staging_leases_ended_total",
                          'end="expired"') == 0
        else:
            assert rma == 0 and inline == 2 * IMAGE_BYTES
            assert sample(cluster, "encoder-0", enc_metric, 'path="inline"') == 2 * IMAGE_BYTES
            assert sample(cluster, "encoder-0", enc_metric, 'path="staged"') == 0
    finally:
        cluster.stop()


def test_an_abandoned_request_releases_its_staged_embeddings():
    # The prefill worker holds each image encode 5 s: the client leaves before it reads.
    cluster = Cluster(1, 1, num_encoder=1, model_dir=FIXTURE,
                      worker_args=["--max-model-len", "256"], router_args=LIMIT_ARGS,
                      role_args={"encoder": ["--embedding-inline-max-bytes", "0"],
                                 "prefill": ["--test-image-encode-delay-ms", "5000"]})
    try:
        payload = json.dumps({"model": "llava-tiny", "messages": PROMPT1, "max_tokens": 8,
                              "temperature": 0, "stream": True}).encode()
        host, port = cluster.url.removeprefix("http://").split(":")
        request = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                   f"application/json\r\nContent-Length: {len(payload)}\r\n\r\n").encode()
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(request + payload)
            wait_until(lambda: cluster.worker_metric(
                "encoder-0", "sluice_encoder_staging_leases") == 2, timeout=10,
                what="the encoder staged both images")
            time.sleep(0.5)
        # Released by the router's abort, well before the 30 s lease ends.
        wait_until(lambda: cluster.worker_metric(
            "encoder-0", "sluice_encoder_staging_leases") == 0, timeout=10,
            what="the staging slots released")
        assert sample(cluster, "encoder-0", "sluice_encoder_staging_leases_ended_total",
                      'end="released"') == 2
        assert sample(cluster, "encoder-0", "sluice_encoder_staging_leases_ended_total",
                      'end="expired"') == 0
        assert sample(cluster, "prefill-0", "sluice_worker_embedding_bytes_total",
                      'path="rma"') == 0
    finally:
        cluster.stop()
