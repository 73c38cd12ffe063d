"""Server behaviour around the API: metrics, HTTP errors, client disconnects, concurrency."""

import concurrent.futures
import json
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

CHAT = [{"role": "user", "content": "Write a poem about rivers."}]


def metric_families(base_url):
    r = httpx.get(base_url + "/metrics", timeout=30)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    return {f.name: f for f in text_string_to_metric_families(r.text)}, r.text


def sample(families, family, name=None, labels=None):
    for s in families[family].samples:
        if (name is None or s.name == name) and all(s.labels.get(k) == v
                                                    for k, v in (labels or {}).items()):
            return s.value
    raise KeyError((family, name, labels))


def test_health(base_url):
    r = httpx.get(base_url + "/health", timeout=30)
    assert r.status_code == 200
    assert r.json() == {"status": "ok"}


def test_metrics_parse(client, model, base_url):
    client.completions.create(model=model, prompt="Hello", max_tokens=3, temperature=0)
    families, text = metric_families(base_url)
    # prometheus_client drops the _total suffix from counter family names.
    for name in ["sluice_http_requests", "sluice_time_to_first_token_seconds",
                 "sluice_inter_token_latency_seconds", "sluice_e2e_request_latency_seconds",
                 "sluice_prompt_tokens", "sluice_generation_tokens",
                 "sluice_num_requests_waiting", "sluice_num_requests_running",
                 "sluice_kv_cache_blocks", "sluice_kv_cache_free_blocks",
                 "sluice_kv_cache_usage_ratio", "sluice_kv_cache_block_size_tokens"]:
        assert name in families, name
    assert families["sluice_time_to_first_token_seconds"].type == "histogram"
    assert families["sluice_http_requests"].type == "counter"
    assert sample(families, "sluice_http_requests", "sluice_http_requests_total",
                  {"endpoint": "/v1/completions", "status": "200"}) >= 1
    assert sample(families, "sluice_generation_tokens") >= 3
    assert sample(families, "sluice_time_to_first_token_seconds",
                  "sluice_time_to_first_token_seconds_count") >= 1
    assert sample(families, "sluice_kv_cache_blocks") > 0
    assert 0.0 <= sample(families, "sluice_kv_cache_usage_ratio") <= 1.0
    assert sample(families, "sluice_kv_cache_block_size_tokens") > 0
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            # Our families, and vLLM's names for what gateways and dashboards read.
            assert line.split()[2].startswith(("sluice_", "vllm:")), line
    assert sample(families, "vllm:generation_tokens", "vllm:generation_tokens_total",
                  {"model_name": model}) >= 3


def test_http_errors(base_url, model):
    assert httpx.get(base_url + "/v1/nothing", timeout=30).status_code == 404
    r = httpx.get(base_url + "/v1/chat/completions", timeout=30)
    assert r.status_code == 405
    r = httpx.post(base_url + "/v1/completions", content=b"{not json", timeout=30,
                   headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert r.json()["error"]["message"]
    big = json.dumps({"model": model, "prompt": "x" * (9 << 20)})
    r = httpx.post(base_url + "/v1/completions", content=big.encode(), timeout=60,
                   headers={"content-type": "application/json"})
    assert r.status_code == 413


def test_client_disconnect_mid_stream(client, model, base_url):
    # Long enough (ignore_eos, ~2000 tokens) that it cannot finish during the checks below.
    body = {"model": model, "messages": CHAT, "max_tokens": 2000, "stream": True,
            "temperature": 0.8, "seed": 5, "ignore_eos": True}
    families, _ = metric_families(base_url)
    aborts = sample(families, "vllm:request_success", "vllm:request_success_total",
                    {"finished_reason": "abort"})
    with httpx.Client(timeout=120) as http:
        with http.stream("POST", base_url + "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            got = 0
            for line in r.iter_lines():
                if line.startswith("data: "):
                    got += 1
                if got >= 3:
                    break
    # The disconnect aborts the engine request: nothing stays in flight or running.
    deadline = time.monotonic() + 5
    while True:
        families, _ = metric_families(base_url)
        if (sample(families, "sluice_http_requests_in_flight") == 0
                and sample(families, "sluice_num_requests_running") == 0):
            break
        assert time.monotonic() < deadline, "the disconnected request was not aborted"
        time.sleep(0.1)
    # vLLM counts a request its client left as finished with reason "abort".
    assert sample(families, "vllm:request_success", "vllm:request_success_total",
                  {"finished_reason": "abort"}) == aborts + 1
    r = client.chat.completions.create(model=model, messages=CHAT, max_tokens=4)
    assert r.choices[0].message.content is not None


def test_concurrent_streams(client, model):
    def run(i):
        chunks = list(client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": f"Story number {i}."}],
            max_tokens=16, temperature=0.7, seed=i, stream=True,
            stream_options={"include_usage": True}))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        return text, finish, chunks[-1].usage

    with concurrent.futures.ThreadPoolExecutor(max_workers=32) as pool:
        results = list(pool.map(run, range(32)))
    assert len(results) == 32
    for text, finish, usage in results:
        assert finish in ("stop", "length")
        assert usage.completion_tokens >= 1
        assert finish == "stop" or usage.completion_tokens == 16


def test_pipelined_request_after_generation_is_answered(base_url, model):
    """Two HTTP/1.1 requests in one write (a generation, then /health) both get responses.

    Regression: the second request's bytes were buffered with the first, and the server waited
    for more input before parsing them.
    """
    import socket
    from urllib.parse import urlparse

    url = urlparse(base_url)
    body = json.dumps({"model": model, "prompt": "Hello", "max_tokens": 2})
    first = (
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n{body}"
    )
    second = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
        sock.sendall((first + second).encode())
        data = b""
        deadline = time.time() + 30
        while data.count(b"HTTP/1.1 200") < 2 and time.time() < deadline:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    assert data.count(b"HTTP/1.1 200") == 2, data[:400]
    assert b'"status":"ok"' in data
