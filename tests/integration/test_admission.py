"""Decode admission reflects the decode workers' real KV (issue 22): router + 1 prefill + 1 decode
worker whose KV cache holds about 4 prompts of 500 tokens (130 blocks of 16).

24 such prompts arrive at once and queue on the prefill worker. The router reserves decode
blocks only for a prefill that is running or has answered, so the decode worker is never full of
reservations for requests still queued: every request answers 200 although the router's queue
timeout for decode blocks (2 s) is far shorter than the prefill backlog. Before, every request
reserved at arrival: the 4 first held the whole decode cache while the others, their first token
ready, waited for blocks and failed with 503 "the decode workers are full" — with 0 running
requests on the decode worker.

Also: with no decode worker left (the only one was SIGTERMed and deregistered), the router
answers HTTP 503 with `Retry-After: 1` and gRPC Generate UNAVAILABLE with a `retry-after: 1`
trailer, the same message on both.
"""

import concurrent.futures
import random

import grpc
import httpx
import pytest

from sluice_cluster import MODEL_NAME, Cluster, http_get, wait_until

N = 24
PROMPT_TOKENS = 500


def test_requests_queued_for_prefill_hold_no_decode_blocks():
    cluster = Cluster(num_prefill=1, num_decode=1,
                      role_args={"decode": ["--num-kv-blocks", "130"]},
                      router_args=["--decode-queue-timeout-s", "2"])
    try:
        rng = random.Random(0)
        prompts = [[rng.randrange(3, 8000) for _ in range(PROMPT_TOKENS)] for _ in range(N)]

        def run(prompt):
            r = httpx.post(cluster.url + "/v1/completions", timeout=300, json={
                "model": MODEL_NAME, "prompt": prompt, "max_tokens": 4, "temperature": 0,
                "ignore_eos": True})
            return r.status_code, r.text[:300]

        with concurrent.futures.ThreadPoolExecutor(N) as pool:
            outcomes = list(pool.map(run, prompts))
        failed = [o for o in outcomes if o[0] != 200]
        assert not failed, f"{len(failed)} of {N} failed, e.g. {failed[0]}"
        assert cluster.metric("sluice_router_decode_queue_timeouts_total") == 0
        assert cluster.metric("sluice_router_worker_failures_total") == 0
        text = http_get(cluster.url + "/metrics")[1]
        assert f'sluice_router_prefills_total{{where="remote"}} {N}' in text.splitlines()
        wait_until(lambda: cluster.worker_metric("decode-0", "sluice_kv_cache_free_blocks") ==
                   cluster.worker_metric("decode-0", "sluice_kv_cache_blocks"), 20,
                   "decode blocks free")
        assert cluster.worker_metric("decode-0", "sluice_decode_reserved_transfers") == 0
    finally:
        cluster.stop()


def test_no_decode_worker_is_a_retriable_503_on_http_and_grpc():
    from test_router_grpc import chat_request, pb_grpc
    cluster = Cluster(num_prefill=1, num_decode=1)
    try:
        worker = cluster.workers["decode-0"]
        worker.proc.terminate()  # SIGTERM: drains (nothing held), deregisters, exits 0
        assert worker.proc.wait(timeout=60) == 0
        wait_until(lambda: not any(w["role"] == "decode" for w in cluster.workers_json()), 10,
                   "decode worker deregistered")
        message = "no decode worker is registered with the router"
        r = httpx.post(cluster.url + "/v1/completions", timeout=60, json={
            "model": MODEL_NAME, "prompt": "x", "max_tokens": 2})
        assert r.status_code == 503 and r.headers["retry-after"] == "1", (r.headers, r.text)
        assert r.json()["error"]["message"] == message
        stub = pb_grpc.InferenceStub(grpc.insecure_channel(f"127.0.0.1:{cluster.grpc_port}"))
        with pytest.raises(grpc.RpcError) as e:
            list(stub.Generate(chat_request("Hello", max_tokens=2), timeout=60))
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        assert e.value.details() == message
        assert dict(e.value.trailing_metadata())["retry-after"] == "1"
    finally:
        cluster.stop()
