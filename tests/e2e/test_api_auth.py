"""API keys and quotas on `sluice serve` (HTTP and gRPC Inference), through the official `openai`
SDK and raw HTTP: 401 with an OpenAI error body, 429 with Retry-After, a key's tenant as its
cache_salt (no cached_tokens across tenants), and SIGHUP reloading the keys file without
dropping open connections.
"""

import hashlib
import http.client
import json
import pathlib
import signal
import tempfile
import time
import urllib.parse
import uuid

import grpc
import openai
import pytest

from conftest import MODEL_NAME, ServerProcess
from ports import free_port

BLOCK_SIZE = 16


def sha256(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def write_keys(path: pathlib.Path, keys):
    path.write_text(json.dumps({"keys": keys}))


def raw(url, method, path, key=None, body=None, conn=None):
    """One HTTP request; returns (status, headers dict (lower-case names), parsed JSON or text)."""
    parsed = urllib.parse.urlparse(url)
    conn = conn or http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=120)
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    conn.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
    resp = conn.getresponse()
    data = resp.read().decode()
    try:
        data = json.loads(data)
    except ValueError:
        pass
    return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data


def question(tag: str) -> str:
    return (f"[{tag}] In the beginning God created the heaven and the earth. And the earth was "
            "without form, and void; and darkness was upon the face of the deep. And the Spirit "
            "of God moved upon the face of the waters. Tell me what happened next.")


@pytest.fixture(scope="module")
def keys_file():
    path = pathlib.Path(tempfile.mkdtemp(prefix="sluice-keys-")) / "keys.json"
    write_keys(path, [
        {"sha256": sha256("sk-acme"), "tenant": "acme"},
        {"sha256": sha256("sk-globex"), "tenant": "globex"},
        {"sha256": sha256("sk-rate"), "name": "rate", "requests_per_second": 0.2},
        {"sha256": sha256("sk-tpm"), "name": "tpm", "tokens_per_minute": 60},
        {"sha256": sha256("sk-reload-old"), "name": "old"},
    ])
    return path


@pytest.fixture(scope="module")
def server(keys_file):
    grpc_port = free_port()
    proc = ServerProcess(extra_args=["--api-keys-file", str(keys_file), "--api-key", "sk-plain",
                                     "--protect-metrics", "--grpc-port", str(grpc_port)])
    proc.grpc_address = f"127.0.0.1:{grpc_port}"
    yield proc
    assert proc.stop() == 0, proc.logs()


def sdk(server, key):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=300)


def test_missing_or_wrong_key_is_401(server):
    for key in (None, "sk-wrong"):
        status, headers, body = raw(server.url, "POST", "/v1/completions", key,
                                    {"model": MODEL_NAME, "prompt": "hi", "max_tokens": 2})
        assert status == 401
        assert headers["www-authenticate"] == "Bearer"
        assert body["error"]["code"] == "invalid_api_key"
        assert body["error"]["type"] == "invalid_request_error"
        assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    with pytest.raises(openai.AuthenticationError) as err:
        sdk(server, "sk-wrong").chat.completions.create(
            model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert err.value.status_code == 401
    assert err.value.body["code"] == "invalid_api_key"
    # /health stays open; /metrics is restricted by --protect-metrics.
    assert raw(server.url, "GET", "/health")[0] == 200
    assert raw(server.url, "GET", "/metrics")[0] == 401
    assert raw(server.url, "GET", "/metrics", "sk-plain")[0] == 200
    # Refused requests never reached the engine (this module's server is fresh: the first
    # test sends only refused generations).
    status, _, metrics = raw(server.url, "GET", "/metrics", "sk-plain")
    assert status == 200
    values = dict(line.rsplit(" ", 1) for line in metrics.splitlines()
                  if line and not line.startswith("#"))
    assert float(values["sluice_prompt_tokens_total"]) == 0
    assert float(values['sluice_http_requests_total{endpoint="other",status="401"}']) >= 4


def test_valid_keys_work_through_the_sdk(server):
    out = sdk(server, "sk-plain").completions.create(model=MODEL_NAME, prompt="Hello",
                                                      max_tokens=3, temperature=0)
    assert out.usage.completion_tokens == 3
    models = sdk(server, "sk-acme").models.list()
    assert [m.id for m in models.data] == [MODEL_NAME]


def test_requests_per_second_429_with_retry_after(server):
    body = {"model": MODEL_NAME, "prompt": "hi", "max_tokens": 1}
    assert raw(server.url, "POST", "/v1/completions", "sk-rate", body)[0] == 200
    status, headers, err = raw(server.url, "POST", "/v1/completions", "sk-rate", body)
    assert status == 429
    # 0.2 requests/s: the next token arrives within 5 s.
    assert 1 <= int(headers["retry-after"]) <= 5
    assert err["error"]["type"] == "rate_limit_error"
    assert err["error"]["code"] == "rate_limit_exceeded"
    assert "requests per second" in err["error"]["message"]
    with pytest.raises(openai.RateLimitError) as sdk_err:
        sdk(server, "sk-rate").completions.create(model=MODEL_NAME, prompt="hi", max_tokens=1)
    assert sdk_err.value.response.headers["retry-after"].isdigit()


def test_tokens_per_minute_429(server):
    # Charged prompt + max_tokens: 60 tokens/min (refilling 1 token/s) admits one ~43-token
    # request, and the next only ~26 s later.
    body = {"model": MODEL_NAME, "prompt": "hi", "max_tokens": 40}
    assert raw(server.url, "POST", "/v1/completions", "sk-tpm", body)[0] == 200
    status, headers, err = raw(server.url, "POST", "/v1/completions", "sk-tpm", body)
    assert status == 429
    assert 5 <= int(headers["retry-after"]) <= 30
    assert "tokens per minute" in err["error"]["message"]
    # Larger than a whole minute's budget: 429 without Retry-After.
    status, headers, err = raw(server.url, "POST", "/v1/completions", "sk-tpm",
                               {"model": MODEL_NAME, "prompt": "hi", "max_tokens": 100})
    assert status == 429 and "retry-after" not in headers
    assert "Request too large" in err["error"]["message"]


def test_tenants_never_share_cached_prefixes(server):
    messages = [{"role": "user", "content": question(uuid.uuid4().hex[:12])}]

    def cached(key, **extra):
        out = sdk(server, key).chat.completions.create(model=MODEL_NAME, messages=messages,
                                                       max_tokens=4, temperature=0, **extra)
        return out.usage.prompt_tokens, out.usage.prompt_tokens_details.cached_tokens

    prompt_tokens, first = cached("sk-acme")
    assert prompt_tokens > 3 * BLOCK_SIZE and first == 0
    # The same tenant reuses its blocks, even when the request names another salt.
    assert cached("sk-acme", extra_body={"cache_salt": "x"})[1] == \
        (prompt_tokens - 1) // BLOCK_SIZE * BLOCK_SIZE
    # Another tenant never does, whatever salt it sends, nor does a tenant-less key.
    assert cached("sk-globex")[1] == 0
    assert cached("sk-plain", extra_body={"cache_salt": "acme"})[1] == 0
    assert cached("sk-plain", extra_body={"cache_salt": "t4:acme"})[1] == 0


def test_grpc_inference_needs_a_key(server):
    from grpc_stubs import pb, pb_grpc
    stub = pb_grpc.InferenceStub(grpc.insecure_channel(server.grpc_address))
    request = pb.GenerateRequest(text="Hello")
    request.sampling.max_tokens = 2
    request.sampling.ignore_eos = True  # a sampled EOS would end it early
    for metadata in ((), (("authorization", "Bearer sk-wrong"),)):
        with pytest.raises(grpc.RpcError) as err:
            list(stub.Generate(request, metadata=metadata, timeout=60))
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as err:
            stub.ListModels(pb.ListModelsRequest(), metadata=metadata, timeout=60)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert stub.Health(pb.HealthRequest(), timeout=60).status == pb.HealthResponse.SERVING
    outs = list(stub.Generate(request, metadata=(("authorization", "Bearer sk-plain"),),
                              timeout=60))
    assert outs[-1].usage.completion_tokens == 2
    # Over a quota: RESOURCE_EXHAUSTED with a retry-after trailer.
    # The key's bucket (0.2/s) may still be empty from the HTTP tests: wait for it to refill.
    deadline = time.monotonic() + 30
    while True:
        try:
            ok = list(stub.Generate(request, metadata=(("authorization", "Bearer sk-rate"),),
                                    timeout=60))
            break
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.RESOURCE_EXHAUSTED or time.monotonic() > deadline:
                raise
            time.sleep(float(dict(e.trailing_metadata()).get("retry-after", "1")))
    assert ok[-1].usage.completion_tokens == 2
    call = stub.Generate(request, metadata=(("authorization", "Bearer sk-rate"),), timeout=60)
    with pytest.raises(grpc.RpcError) as err:
        list(call)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert int(dict(err.value.trailing_metadata())["retry-after"]) >= 1


def test_sighup_reloads_keys_without_dropping_connections(server, keys_file):
    parsed = urllib.parse.urlparse(server.url)
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=120)
    assert raw(server.url, "GET", "/v1/models", "sk-reload-old", conn=conn)[0] == 200
    sock = conn.sock
    assert raw(server.url, "GET", "/v1/models", "sk-reload-new")[0] == 401
    original = json.loads(keys_file.read_text())["keys"]
    try:
        write_keys(keys_file, [k for k in original if k.get("name") != "old"] +
                   [{"sha256": sha256("sk-reload-new"), "name": "new"}])
        server.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 30
        while raw(server.url, "GET", "/v1/models", "sk-reload-new")[0] != 200:
            assert time.monotonic() < deadline, server.logs()
            time.sleep(0.1)
        # The same keep-alive connection goes on, now under the new key set.
        assert raw(server.url, "GET", "/v1/models", "sk-reload-old", conn=conn)[0] == 401
        assert raw(server.url, "GET", "/v1/models", "sk-reload-new", conn=conn)[0] == 200
        assert conn.sock is sock
        # A broken file keeps the keys in force.
        keys_file.write_text("{broken")
        server.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 30
        while "keeping the previous API keys" not in server.logs():
            assert time.monotonic() < deadline, server.logs()
            time.sleep(0.1)
        assert raw(server.url, "GET", "/v1/models", "sk-reload-new", conn=conn)[0] == 200
        assert server.proc.poll() is None
    finally:
        write_keys(keys_file, original)
        conn.close()
