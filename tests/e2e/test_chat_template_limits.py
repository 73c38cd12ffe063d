"""A client-supplied `chat_template` cannot take the server's CPU: each render has a work
budget (operations, bytes of work, loop iterations, macro depth), a hostile template gets a 400
naming the limit it hit, and renders run off the HTTP I/O threads on a pool of their own, so
requests with the model's template and /health go on while hostile renders run."""

import json
import pathlib
import threading
import time
import urllib.error
import urllib.request

import pytest

from ports import free_port

CHAT = [{"role": "user", "content": "Who made the heaven and the earth?"}]

# (template, the limit it exhausts). Each would run for minutes to hours without a budget.
HOSTILE = {
    # 10^6 iterations, under the iteration limit, building 100 KB each: 100 GB of work.
    "huge_strings": ("{% for i in range(1000) %}{% for j in range(1000) %}"
                     "{% set x = 'y' * 100000 %}{% endfor %}{% endfor %}", "max_work_bytes"),
    # sum() of strings copies its running total every step (quadratic).
    "quadratic_sum": ("{{ (['x' * 160] * 100000) | sum(start='') }}", "max_work_bytes"),
    # Nested loops of cheap bodies.
    "nested_loops": ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
                     "{% endfor %}", "max_loop_iterations"),
    # Depth 40 is allowed, 2^40 calls are not.
    "recursive_macro": ("{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}"
                        "{% endmacro %}{{ f(40) }}", "max_operations"),
    # Unbounded recursion.
    "deep_recursion": ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
                       "max_call_depth"),
}


def post(base_url, path, body, timeout=300):
    req = urllib.request.Request(base_url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_template_is_400_naming_the_limit(base_url, model, name):
    template, limit = HOSTILE[name]
    start = time.monotonic()
    status, body = post(base_url, "/v1/chat/completions",
                        {"model": model, "messages": CHAT, "max_tokens": 4,
                         "chat_template": template})
    elapsed = time.monotonic() - start
    assert status == 400, body
    assert body["error"]["param"] == "chat_template"
    assert body["error"]["type"] == "invalid_request_error"
    assert f"({limit}" in body["error"]["message"], body
    # Promptly: the budget stops it within seconds (without it: minutes to hours).
    assert elapsed < 60, elapsed


def test_hostile_kwargs_for_the_model_template_are_bounded(base_url, model):
    """chat_template_kwargs reach the model's template; a template that loops over them is
    bounded the same way (here: the request's template stands in for such a model)."""
    template = ("{% for i in range(n) %}{% for j in range(n) %}{{ pad }}{% endfor %}"
                "{% endfor %}")
    status, body = post(base_url, "/v1/chat/completions",
                        {"model": model, "messages": CHAT, "max_tokens": 4,
                         "chat_template": template,
                         "chat_template_kwargs": {"n": 100000, "pad": "z" * 1000}})
    assert status == 400, body
    assert body["error"]["message"].endswith(
        "rendered output exceeds the limit of 16777216 bytes (max_output_bytes)"), body


def test_normal_requests_complete_while_hostile_renders_run(base_url, model):
    """Hostile renders queue on their own pool (one thread): a request with the model's
    template, and /health, are answered before the hostile ones are all done."""
    template, _ = HOSTILE["recursive_macro"]
    done = {}

    def hostile(i):
        status, body = post(base_url, "/v1/chat/completions",
                            {"model": model, "messages": CHAT, "max_tokens": 4,
                             "chat_template": template})
        done[i] = (time.monotonic(), status, body)

    threads = [threading.Thread(target=hostile, args=(i,)) for i in range(10)]
    for t in threads:
        t.start()
    time.sleep(0.3)  # the hostile renders have started
    with urllib.request.urlopen(base_url + "/health", timeout=60) as r:
        assert r.status == 200
    status, body = post(base_url, "/v1/chat/completions",
                        {"model": model, "messages": CHAT, "max_tokens": 4, "temperature": 0})
    normal_done = time.monotonic()
    assert status == 200, body
    assert body["usage"]["completion_tokens"] > 0
    for t in threads:
        t.join(timeout=600)
    assert len(done) == 10
    for _, status, body in done.values():
        assert status == 400 and "(max_operations)" in body["error"]["message"], body
    # Ten renders of ~10^7 operations each (~0.5 s each here), one at a time, outlast the normal
    # request (~0.1 s alone, ~1 s beside a render on a busy 2-core machine).
    assert normal_done < max(t for t, _, _ in done.values())


def test_abandoned_hostile_renders_stop_and_the_server_goes_on(server, base_url, model):
    """Clients that disconnect mid-render: their renders stop (running or queued), logged as
    such instead of running to the budget's 400, and the server keeps serving."""
    import socket
    from urllib.parse import urlparse
    template, _ = HOSTILE["recursive_macro"]
    marker = "/v1/chat/completions: parse stopped, the client went away"

    def stopped():
        server.log.flush()
        return pathlib.Path(server.log.name).read_text(errors="replace").count(marker)

    before = stopped()
    url = urlparse(base_url)
    payload = json.dumps({"model": model, "messages": CHAT, "max_tokens": 4,
                          "chat_template": template}).encode()
    for _ in range(4):
        with socket.create_connection((url.hostname, url.port), timeout=10) as s:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                      b"Content-Type: application/json\r\nContent-Length: " +
                      str(len(payload)).encode() + b"\r\n\r\n" + payload)
    deadline = time.monotonic() + 120
    while stopped() < before + 4 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert stopped() == before + 4, server.logs()
    status, body = post(base_url, "/v1/chat/completions",
                        {"model": model, "messages": CHAT, "max_tokens": 4, "temperature": 0})
    assert status == 200, body


# ---- render flags (sluice serve --render-*) ----

@pytest.mark.parametrize("flag,value,expected", [
    ("--render-threads", "0", "--render-threads: invalid value '0' (expected an integer in [1, 256])"),
    ("--custom-template-render-threads", "-1",
     "--custom-template-render-threads: invalid value '-1' (expected an integer in [0, 256])"),
    ("--max-queued-renders", "0",
     "--max-queued-renders: invalid value '0' (expected an integer in [1, 1048576])"),
    ("--render-timeout-s", "0", "--render-timeout-s: must be seconds in (0, 3600], got 0"),
    ("--render-timeout-s", "1e9", "--render-timeout-s: must be seconds in (0, 3600], got 1e9"),
    ("--render-max-operations", "0",
     "--render-max-operations: invalid value '0' (expected an integer in [1, 1125899906842624])"),
    ("--render-max-call-depth", "1000",
     "--render-max-call-depth: invalid value '1000' (expected an integer in [1, 256])"),
    ("--render-max-output-bytes", "16777217",
     "--render-max-output-bytes: invalid value '16777217' (expected an integer in [1, 16777216])"),
    ("--render-max-loop-iterations", "-5",
     "--render-max-loop-iterations: invalid value '-5' (expected an integer in [1, "
     "1125899906842624])"),
])
def test_render_flags_are_validated(flag, value, expected):
    from conftest import MODEL_DIR, sluice_bin
    import subprocess
    r = subprocess.run([sluice_bin(), "serve", "--model", str(MODEL_DIR), "--port", "0", flag,
                        value], capture_output=True, text=True, timeout=120)
    # A usage error (test_cli_usage.py), found before the model loads.
    assert (r.returncode, r.stderr) == (
        2, f"sluice: error: {expected}\nRun 'sluice serve --help' for usage.\n")


def test_render_budget_flags_apply_to_http_and_grpc():
    """--render-max-loop-iterations bounds the model's template on both APIs: six messages
    are six iterations of its message loop, one more than the budget."""
    import grpc
    from conftest import ServerProcess
    from grpc_stubs import pb
    from grpc_stubs import pb_grpc
    grpc_port = free_port()
    server = ServerProcess(["--render-max-loop-iterations", "5", "--render-threads", "1",
                            "--grpc-port", str(grpc_port)])
    try:
        turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"}
                 for i in range(6)]
        status, body = post(server.url, "/v1/chat/completions",
                            {"model": "sluice-mini-moe", "messages": turns, "max_tokens": 2})
        assert status == 400, body
        assert body["error"]["param"] == "messages"
        message = body["error"]["message"]
        assert message.startswith("chat template: line ") and message.endswith(
            "template exceeds its render budget of 5 loop iterations (max_loop_iterations)"), body
        stub = pb_grpc.InferenceStub(grpc.insecure_channel(f"127.0.0.1:{grpc_port}"))
        request = pb.GenerateRequest(chat=pb.ChatPrompt(
            messages=[pb.ChatMessage(role=t["role"], content=t["content"]) for t in turns],
            add_generation_prompt=True))
        with pytest.raises(grpc.RpcError) as info:
            for _ in stub.Generate(request, timeout=60):
                pass
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert info.value.details() == message
        # Five messages fit.
        status, body = post(server.url, "/v1/chat/completions",
                            {"model": "sluice-mini-moe", "messages": turns[:5], "max_tokens": 2})
        assert status == 200, body
    finally:
        assert server.stop() == 0


def test_shutdown_cancels_running_renders():
    """SIGTERM stops a render that would run for hours (the budget and timeout set past it):
    the server exits promptly instead of waiting for it."""
    huge = str(1 << 50)
    from conftest import ServerProcess
    server = ServerProcess(["--render-max-operations", huge, "--render-max-loop-iterations", huge,
                            "--render-max-work-bytes", huge, "--render-timeout-s", "3600"])
    template, _ = HOSTILE["nested_loops"]
    result = {}

    def hostile():
        result["answer"] = post(server.url, "/v1/chat/completions",
                                {"model": "sluice-mini-moe", "messages": CHAT, "max_tokens": 4,
                                 "chat_template": template}, timeout=120)

    thread = threading.Thread(target=lambda: _swallow(hostile, result), daemon=True)
    thread.start()
    time.sleep(1.0)  # the render is running
    assert thread.is_alive()
    start = time.monotonic()
    code = server.stop()
    elapsed = time.monotonic() - start
    assert code == 0, server.logs()
    assert elapsed < 10, elapsed
    thread.join(timeout=30)
    assert "answer" not in result  # the request got no answer: the server went away


def _swallow(fn, result):
    try:
        fn()
    except OSError as e:  # the connection closed with the server
        result["error"] = e
