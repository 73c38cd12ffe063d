"""A client that leaves while the router's Reserve on the decode worker is in flight frees the
decode worker's blocks at once, not at its reservation timeout (30 s).

The decode worker holds each Reserve's answer 1.5 s after it reserved the blocks and issued the
reservation's token (--test-reserve-answer-delay-ms): the window in which an answer is on its way.
The client closes its stream inside that window. The router lets the Reserve answer and cancels
with the token it brings (a Cancel without it is refused: docs/security.md), so the blocks are
free again about when the answer arrives. Before, the router cancelled the Reserve call itself and
its Cancel carried no token: the blocks stayed reserved for 30 s.
"""

import json
import socket
import time

import openai
import pytest

from sluice_cluster import MODEL_NAME, Cluster, sum_samples, wait_until

ANSWER_DELAY_S = 1.5
FREED_WITHIN_S = 2.0  # after the answer's delay; the reservation timeout is 30 s


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(num_prefill=1, num_decode=1, role_args={
        "decode": ["--test-reserve-answer-delay-ms", str(int(ANSWER_DELAY_S * 1000))]})
    yield c
    c.stop()


def decode_figures(cluster):
    d = cluster.worker_metrics_text("decode-0")
    return {name: sum_samples(d, name) for name in (
        "sluice_kv_cache_used_blocks", "sluice_decode_reserved_transfers",
        "sluice_decode_sessions")}


def test_abort_during_reserve_frees_decode_blocks_at_once(cluster):
    baseline = decode_figures(cluster)
    assert all(v == 0 for v in baseline.values()), baseline
    host, port = cluster.url.removeprefix("http://").split(":")
    payload = json.dumps({
        "model": MODEL_NAME, "messages": [{"role": "user", "content": "Count to twenty."}],
        "max_tokens": 32, "temperature": 0, "stream": True}).encode()
    request = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
               f"application/json\r\nContent-Length: {len(payload)}\r\n\r\n").encode() + payload
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(request)
        sent = time.monotonic()
        # The decode worker reserved: its answer (and the first token) are held back.
        wait_until(lambda: decode_figures(cluster)["sluice_decode_reserved_transfers"] == 1,
                   ANSWER_DELAY_S / 2, "the decode worker reserved", interval=0.02)
        assert time.monotonic() - sent < ANSWER_DELAY_S
        sock.setblocking(False)
        try:
            received = sock.recv(65536)
        except BlockingIOError:
            received = b""
    closed = time.monotonic()
    # No token reached the client (at most the opening role chunk): it left during the Reserve.
    assert received.count(b"data: ") <= 1 and b'"finish_reason":"' not in received, received
    last = {}

    def freed():
        last.update(decode_figures(cluster))
        return all(v == 0 for v in last.values())

    wait_until(freed, ANSWER_DELAY_S + FREED_WITHIN_S, "decode blocks back to baseline",
               interval=0.05)
    freed_after = time.monotonic() - closed
    assert freed_after < ANSWER_DELAY_S + FREED_WITHIN_S, (freed_after, last)
    # Freed by the router's Cancel with the token, not by the decode worker noticing that the
    # answer was lost (nor by the reservation timeout).
    log = cluster.workers["decode-0"].log_path.read_text(errors="replace")
    assert "did not reach the caller" not in log, log[-3000:]
    assert "not claimed by a Decode in time" not in log, log[-3000:]
    # The workers still serve.
    client = openai.OpenAI(base_url=cluster.url + "/v1", api_key="x", timeout=60, max_retries=0)
    r = client.chat.completions.create(
        model=MODEL_NAME, temperature=0, max_tokens=4,
        messages=[{"role": "user", "content": "Still there?"}])
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 4
