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

    threads = [threading.Thread(target=hostile, args=(i,)) for i in range(6)]
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
    assert len(done) == 6
    for _, status, body in done.values():
        assert status == 400 and "(max_operations)" in body["error"]["message"], body
    # Six renders of ~10^7 operations each, one at a time, outlast the normal request.
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
