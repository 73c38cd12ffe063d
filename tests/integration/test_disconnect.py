"""Client disconnects free the request's KV blocks on both workers (router + 1 prefill + 1 decode).

Streams are closed (1) before the first token, while the prefill worker computes a long prompt,
(2) right after the first token (while the decode worker reserves/transfers), and (3) mid-stream
during decode. Other requests run at the same time and must complete. Then both workers' /metrics
must show no KV block in use, none pinned on prefill, no reservation on decode — well before the
pin and reservation timeouts (30 s) could have freed them, and none freed by those timeouts.
"""

import concurrent.futures
import json
import socket
import time

import httpx
import openai
import pytest

from sluice_cluster import MODEL_NAME, Cluster, sum_samples, wait_until

FREE_DEADLINE_S = 10  # well below --kv-pin-timeout-s / --reserve-timeout-s (30 s)
LONG_PROMPT = "Summarize: " + " ".join(f"item{i}" for i in range(500))


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(num_prefill=1, num_decode=1)
    yield c
    c.stop()


def body(content, max_tokens, stream=True):
    return {"model": MODEL_NAME, "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": stream}


def close_before_first_token(url, delay_s):
    """Sends a long-prompt streaming request on a raw socket and closes after `delay_s`."""
    host, port = url.removeprefix("http://").split(":")
    payload = json.dumps(body(LONG_PROMPT, 64)).encode()
    request = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
               f"application/json\r\nContent-Length: {len(payload)}\r\n\r\n").encode() + payload
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(request)
        time.sleep(delay_s)
        sock.setblocking(False)
        try:
            received = sock.recv(65536)
        except BlockingIOError:
            received = b""
    return received


def close_after_chunks(url, content, num_chunks):
    """Streams a long generation and closes the connection after `num_chunks` token events."""
    got = 0
    with httpx.Client(timeout=60) as http:
        with http.stream("POST", url + "/v1/chat/completions",
                         json=body(content, 1500)) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    choice = json.loads(line[6:])["choices"][0]
                    assert choice["finish_reason"] is None, choice
                    got += "content" in choice["delta"] and "role" not in choice["delta"]
                if got >= num_chunks:
                    break
    return got


def in_use(cluster):
    """Per-worker KV figures that must all reach zero."""
    p = cluster.worker_metrics_text("prefill-0")
    d = cluster.worker_metrics_text("decode-0")
    return {
        "prefill used": sum_samples(p, "sluice_kv_cache_used_blocks"),
        "prefill held": sum_samples(p, "sluice_prefill_held_blocks"),
        "prefill running": sum_samples(p, "sluice_num_requests_running"),
        "decode used": sum_samples(d, "sluice_kv_cache_used_blocks"),
        "decode reserved": sum_samples(d, "sluice_decode_reserved_transfers"),
        "decode running": sum_samples(d, "sluice_num_requests_running"),
        "decode sessions": sum_samples(d, "sluice_decode_sessions"),
    }


def wait_all_free(cluster):
    last = {}

    def all_free():
        last.update(in_use(cluster))
        return all(v == 0 for v in last.values())

    try:
        wait_until(all_free, FREE_DEADLINE_S, "KV blocks freed on both workers")
    except TimeoutError as e:
        raise AssertionError(f"{e}: {last}") from None
    p = cluster.worker_metrics_text("prefill-0")
    # Freed by the aborts and acks, not by the pin timeout.
    assert 'sluice_prefill_held_released_total{reason="expired"} 0' in p, p


def test_disconnects_free_blocks_on_both_workers(cluster):
    client = openai.OpenAI(base_url=cluster.url + "/v1", api_key="x", timeout=120, max_retries=0)

    def normal(i):
        r = client.chat.completions.create(
            model=MODEL_NAME, temperature=0, max_tokens=24,
            messages=[{"role": "user", "content": f"Other request {i}: name a fruit."}])
        return r.choices[0].finish_reason, r.usage.completion_tokens

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        others = [pool.submit(normal, i) for i in range(6)]
        early = [pool.submit(close_before_first_token, cluster.url, 0.05) for _ in range(3)]
        mid = [pool.submit(close_after_chunks, cluster.url, f"Tell a long story {i}.", 4)
               for i in range(3)]
        for f in early:
            # Closed before any token arrived: at most the opening role chunk was sent.
            received = f.result(timeout=60)
            assert received.count(b"data: ") <= 1 and b'"finish_reason":"' not in received
        assert all(f.result(timeout=60) == 4 for f in mid)
        results = [f.result(timeout=120) for f in others]
    assert all(reason in ("stop", "length") and n >= 1 for reason, n in results), results

    wait_all_free(cluster)
    # The early closes cancelled prefills in flight; the others cancelled decodes.
    p = cluster.worker_metrics_text("prefill-0")
    assert 'sluice_worker_requests_total{status="cancelled"}' in p, p
    d = cluster.worker_metrics_text("decode-0")
    assert 'sluice_worker_requests_total{status="cancelled"}' in d, d
    # The workers still serve.
    assert client.chat.completions.create(
        model=MODEL_NAME, temperature=0, max_tokens=4,
        messages=[{"role": "user", "content": "Still there?"}]).choices[0].finish_reason


def test_disconnect_right_after_first_token_frees_blocks(cluster):
    # Worker-side regressions covered here: a Decode call cancelled before its handler ran got no
    # OnCancel, and a transfer job could start after Cancel() had aborted the reservation; the
    # reservation and the prefill pin then stayed until their 30 s timeouts.
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        first = [pool.submit(close_after_chunks, cluster.url, f"First token only {i}.", 1)
                 for i in range(6)]
        assert all(f.result(timeout=60) == 1 for f in first)
    wait_all_free(cluster)
