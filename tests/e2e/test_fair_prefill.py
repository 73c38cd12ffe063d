"""Fair prefill end to end: on `sluice serve`, a short prompt sent after long ones gets its
answer before them with the default scheduling (shortest_prefill_first, step time budget),
and after them with --scheduling-policy fcfs (the contrast shows the test can fail). Also: the
`priority` field orders prefills under --scheduling-policy priority, a non-zero `priority` under
fcfs (which would ignore it) is refused as vLLM does (HTTP 400, gRPC INVALID_ARGUMENT), and a bad
policy name fails at start-up.

Orders are asserted, never durations (speed lives in bench/fair_prefill_bench.py).
"""

import random
import subprocess
import threading
import time

import grpc
import httpx
import pytest

from conftest import MODEL_DIR, MODEL_NAME, ServerProcess, sluice_bin
from ports import free_port

LONG_TOKENS = 1200
VOCAB = 8192


def completion(client, tokens, done, name, priority=None):
    body = {"model": MODEL_NAME, "prompt": tokens, "max_tokens": 1, "temperature": 0}
    if priority is not None:
        body["priority"] = priority
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == len(tokens)
    done.append(name)


def finish_order(url, requests, gap_s=0.3):
    """Sends requests [(name, tokens, priority)] `gap_s` apart, returns the order they ended."""
    done = []
    threads = []
    # Each request gets a kept-alive connection opened beforehand, so sending one is its arrival:
    # connecting inside the threads let a later one overtake an earlier one on a loaded machine.
    clients = [httpx.Client(base_url=url, timeout=600) for _ in requests]
    try:
        for client in clients:
            assert client.get("/health").status_code == 200
        for client, (name, tokens, priority) in zip(clients, requests):
            t = threading.Thread(target=completion, args=(client, tokens, done, name, priority))
            t.start()
            threads.append(t)
            time.sleep(gap_s)
        for t in threads:
            t.join(timeout=600)
    finally:
        for client in clients:
            client.close()
    assert len(done) == len(requests), done
    return done


def prompt(seed, n):
    rng = random.Random(seed)
    return [rng.randrange(3, VOCAB) for _ in range(n)]


@pytest.mark.parametrize("flags,short_first", [
    ([], True),  # defaults: shortest_prefill_first, step time budget
    (["--scheduling-policy", "fcfs", "--step-time-budget-ms", "0"], False),
])
def test_short_prompt_overtakes_long_ones(flags, short_first):
    # A small token budget makes the long prompts take many steps on any machine.
    server = ServerProcess(extra_args=["--max-num-batched-tokens", "128", *flags])
    try:
        # Warm-up: the step cost model is fitted from a few steps of each kind.
        finish_order(server.url, [("w1", prompt(9, 300), None), ("w2", prompt(8, 3), None)], 0)
        order = finish_order(server.url, [("long1", prompt(1, LONG_TOKENS), None),
                                          ("long2", prompt(2, LONG_TOKENS), None),
                                          ("long3", prompt(3, LONG_TOKENS), None),
                                          ("short", prompt(4, 5), None)], gap_s=0.02)
    finally:
        assert server.stop() == 0
    if short_first:
        assert order[0] == "short", order
    else:
        # fcfs: the short prompt waits behind the long ones queued before it (it may share the
        # last one's final step). The long ones' threads may reach the server in either order on a
        # loaded machine, so only the short prompt's place is asserted.
        assert "short" not in order[:2], order


def test_priority_field_orders_prefills():
    server = ServerProcess(extra_args=["--scheduling-policy", "priority",
                                       "--max-num-batched-tokens", "128"])
    try:
        long1, long2, long3 = (prompt(k, LONG_TOKENS) for k in (5, 6, 7))
        # long1 starts first; of the two queued behind it, priority -1 goes before 5 although
        # it came later.
        order = finish_order(server.url, [("first", long1, 0), ("late", long2, 5),
                                          ("urgent", long3, -1)], gap_s=0.05)
        r = httpx.post(server.url + "/v1/completions",
                       json={"model": MODEL_NAME, "prompt": "x", "priority": "high"}, timeout=60)
        assert r.status_code == 400 and "priority" in r.text
    finally:
        assert server.stop() == 0
    assert order.index("urgent") < order.index("late"), order


def test_priority_under_fcfs_is_refused():
    from grpc_stubs import pb, pb_grpc
    grpc_port = free_port()
    server = ServerProcess(extra_args=["--scheduling-policy", "fcfs",
                                       "--grpc-port", str(grpc_port)])
    message = ("priority 3 was given, but priority scheduling is not enabled "
               "(--scheduling-policy fcfs; use priority or shortest_prefill_first)")
    try:
        for path, body in (("/v1/completions", {"prompt": "x"}),
                           ("/v1/chat/completions", {"messages": [{"role": "user",
                                                                   "content": "x"}]})):
            for stream in (False, True):
                r = httpx.post(server.url + path, timeout=60, json={
                    "model": MODEL_NAME, "max_tokens": 2, "priority": 3, "stream": stream,
                    **body})
                assert r.status_code == 400, (path, stream, r.text)
                err = r.json()["error"]
                assert err["message"] == message and err["type"] == "invalid_request_error"
        # Priority 0 (the default class) is accepted; the server goes on serving.
        r = httpx.post(server.url + "/v1/completions", timeout=60, json={
            "model": MODEL_NAME, "prompt": "x", "max_tokens": 2, "priority": 0,
            "ignore_eos": True})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
        stub = pb_grpc.InferenceStub(grpc.insecure_channel(f"127.0.0.1:{grpc_port}"))
        request = pb.GenerateRequest(text="x", priority=3)
        request.sampling.max_tokens = 2
        with pytest.raises(grpc.RpcError) as e:
            list(stub.Generate(request, timeout=60))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert e.value.details() == message
    finally:
        assert server.stop() == 0


def test_bad_policy_is_refused_at_start():
    r = subprocess.run([sluice_bin(), "serve", "--model", str(MODEL_DIR), "--port", "0",
                        "--scheduling-policy", "sjf"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "--scheduling-policy" in r.stdout + r.stderr
