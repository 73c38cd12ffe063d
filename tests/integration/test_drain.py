"""Graceful drain of the router and the kvstore (issue 22), under load.

1. Router: SIGTERM while streams are under way. At once /health answers 503 and a new request
   gets 503 with `Retry-After: 1` ("the router is draining ..."); the streams under way finish
   with the text of the undisturbed run; the router exits 0.
2. kvstore: SIGTERM while prefill and decode workers read and write through it. It ends its
   leases within --drain-timeout-s and exits 0; the workers treat it as a miss (compute the
   prompt) and no request fails; every output equals the undisturbed run.
"""

import concurrent.futures
import signal
import tempfile
import time

import httpx

from sluice_cluster import MODEL_NAME, Cluster, wait_until
from test_faults import Reference, client_for, complete, stream
from test_kvstore_prefill import KvStore

N = 6


def test_router_drains_streams_and_refuses_new_requests():
    reference = Reference()
    try:
        reference.warm([(i, 64) for i in range(N)])
    finally:
        reference.serve.stop()
    cluster = Cluster(num_prefill=1, num_decode=1, router_args=["--drain-timeout-s", "60"])
    try:
        client = client_for(cluster.url)
        counts = {}
        with concurrent.futures.ThreadPoolExecutor(N) as pool:
            futures = [pool.submit(stream, client, i, 64, counts) for i in range(N)]
            wait_until(lambda: all(counts.get(i, 0) >= 3 for i in range(N)), 120,
                       "every stream under way")
            router = cluster.router.proc
            router.send_signal(signal.SIGTERM)
            wait_until(lambda: httpx.get(cluster.url + "/health", timeout=5).status_code == 503,
                       10, "router /health 503")
            r = httpx.post(cluster.url + "/v1/completions", timeout=30, json={
                "model": MODEL_NAME, "prompt": "x", "max_tokens": 2})
            assert r.status_code == 503, r.text
            assert r.headers["retry-after"] == "1"
            assert "draining" in r.json()["error"]["message"]
            outputs = [f.result(timeout=300) for f in futures]
        assert outputs == [reference[(i, 64)] for i in range(N)]
        assert router.wait(timeout=60) == 0
    finally:
        cluster.stop()


def test_kvstore_drain_under_load_fails_nothing():
    reference = Reference()
    try:
        reference.warm([(i, 8) for i in range(3 * N)])
    finally:
        reference.serve.stop()
    store = KvStore(tempfile.mkdtemp(prefix="sluice-kvstore-drain-"))
    cluster = None
    try:
        cluster = Cluster(num_prefill=1, num_decode=1, worker_args=["--kvstore", store.address])
        client = client_for(cluster.url)
        # Fill the store, then read it back (same prompts) while it drains.
        first = [complete(client, i, 8) for i in range(N)]
        assert first == [reference[(i, 8)] for i in range(N)]
        with concurrent.futures.ThreadPoolExecutor(N) as pool:
            futures = [pool.submit(complete, client, i % (2 * N), 8) for i in range(3 * N)]
            time.sleep(0.2)
            store.proc.proc.send_signal(signal.SIGTERM)
            outputs = [f.result(timeout=300) for f in futures]
        assert outputs == [reference[(i % (2 * N), 8)] for i in range(3 * N)]
        assert store.proc.proc.wait(timeout=30) == 0
        # After the store is gone, requests still succeed (computed in full).
        assert complete(client, 2 * N, 8) == reference[(2 * N, 8)]
        assert cluster.metric("sluice_router_worker_failures_total") == 0
    finally:
        if cluster is not None:
            cluster.stop()
        store.proc.stop()
