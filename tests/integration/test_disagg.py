"""Disaggregated serving end to end: router + 2 prefill + 2 decode processes.

1. 200 concurrent greedy chat requests through the official openai SDK: every completion equals
   what `sluice serve` returns for the same request (so the KV moved between workers is right),
   and the KV blocks in use return to zero afterwards.
2. Fault: kill -9 a decode worker while requests stream: its requests end promptly with an error
   (or complete, when retried before any token), all others complete, the router drops the
   worker, and a restarted worker rejoins and gets work.
3. Fault: the same for a prefill worker under a steady flow of streaming requests: requests whose
   prefill it had (or that pick it before the router notices) are retried on the other prefill
   worker; only a request whose first token was already sent may end with an error event. The
   router drops the worker on the failed connection (a probe), not at its lease's end.
"""

import concurrent.futures
import time

import openai
import pytest

from sluice_cluster import MODEL_NAME, Cluster, Serve, wait_until

NUM_REQUESTS = 200
MAX_TOKENS = 16
REQUEST_TIMEOUT_S = 240


def messages(i):
    return [{"role": "user", "content": f"Question {i}: name {i % 7 + 2} colors of the sky."}]


def complete(client, i):
    r = client.chat.completions.create(model=MODEL_NAME, messages=messages(i), temperature=0,
                                       max_tokens=MAX_TOKENS)
    return r.choices[0].message.content, r.choices[0].finish_reason, r.usage.completion_tokens


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(num_prefill=2, num_decode=2)
    yield c
    c.stop()


@pytest.fixture(scope="module")
def reference():
    s = Serve()
    client = openai.OpenAI(base_url=s.url + "/v1", api_key="x", timeout=REQUEST_TIMEOUT_S,
                           max_retries=0)
    # 7 distinct prompt shapes, but every request is compared: the ids differ per request.
    with concurrent.futures.ThreadPoolExecutor(NUM_REQUESTS) as pool:
        outputs = list(pool.map(lambda i: complete(client, i), range(NUM_REQUESTS)))
    s.stop()
    return outputs


def test_200_concurrent_greedy_chats_match_sluice_serve(cluster, reference):
    client = openai.OpenAI(base_url=cluster.url + "/v1", api_key="x",
                           timeout=REQUEST_TIMEOUT_S, max_retries=0)
    start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(NUM_REQUESTS) as pool:
        outputs = list(pool.map(lambda i: complete(client, i), range(NUM_REQUESTS)))
    elapsed = time.monotonic() - start
    mismatches = [i for i in range(NUM_REQUESTS) if outputs[i] != reference[i]]
    assert not mismatches, (f"{len(mismatches)} of {NUM_REQUESTS} differ, first "
                            f"{mismatches[0]}: {outputs[mismatches[0]]} vs "
                            f"{reference[mismatches[0]]}")
    print(f"\n{NUM_REQUESTS} concurrent chats through the router in {elapsed:.1f}s")
    # Both prefill workers were used, and every request's first token came from one.
    assert cluster.metric("sluice_router_prefills_total") >= NUM_REQUESTS
    # KV blocks in use return to zero on every worker (heartbeats carry the counts).
    wait_until(lambda: cluster.metric("sluice_kv_cache_blocks") > 0 and
               cluster.metric("sluice_kv_cache_free_blocks") ==
               cluster.metric("sluice_kv_cache_blocks"), 30, "KV blocks back to free")
    assert cluster.metric("sluice_router_worker_assigned_requests") == 0


def stream(client, i, events):
    """Streams request i; returns ("ok", text, n) or ("error", message, n), n = content chunks
    received before the end, recording the time of the last one in events[i]."""
    text, n = "", 0
    try:
        s = client.chat.completions.create(model=MODEL_NAME, messages=messages(i), temperature=0,
                                           max_tokens=48, stream=True)
        for chunk in s:
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
                n += 1
                events[i] = time.monotonic()
        return "ok", text, n
    except (openai.APIError, openai.APIConnectionError) as e:
        return "error", str(e), n


def assert_clear_errors(errors):
    assert all("worker" in msg or "Unavailable" in msg or "error" in msg.lower()
               for _, msg, _ in errors), errors


def assert_restart_rejoins(cluster, client, role, victim, addresses, survivors):
    """Restarts `victim` (same address); it registers again and gets picked for new work."""
    victim.start()
    wait_until(lambda: cluster.addresses(role) == addresses, 120,
               f"restarted {role} worker registered")
    victim_address = [a for a in addresses if a not in survivors][0]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        outs = list(pool.map(lambda i: complete(client, i), range(8)))
    assert all(o[1] in ("stop", "length") for o in outs)
    rejoined = [w for w in cluster.workers_json() if w["address"] == victim_address]
    assert len(rejoined) == 1 and rejoined[0]["picked"] > 0, rejoined


def test_kill_decode_worker_mid_stream(cluster):
    client = openai.OpenAI(base_url=cluster.url + "/v1", api_key="x", timeout=120,
                           max_retries=0)
    decode_addresses = cluster.addresses("decode")
    victim = cluster.workers["decode-0"]
    events = {}
    n = 24
    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        futures = [pool.submit(stream, client, i, events) for i in range(n)]
        wait_until(lambda: len(events) >= n // 2, 120, "half the streams producing tokens")
        killed_at = time.monotonic()
        victim.kill9()
        results = [f.result(timeout=180) for f in futures]
    errors = [r for r in results if r[0] == "error"]
    oks = [r for r in results if r[0] == "ok"]
    assert len(oks) + len(errors) == n
    assert len(oks) >= n // 4, f"too few requests completed: {len(oks)} of {n}"
    # The failed ones failed promptly (not at a deadline) and said why.
    assert_clear_errors(errors)
    assert time.monotonic() - killed_at < 60
    # The router drops the worker (broken connection or missed lease)...
    wait_until(lambda: len(cluster.addresses("decode")) == 1, 15, "router dropping the worker")
    # ...and a restarted worker rejoins and gets work.
    assert_restart_rejoins(cluster, client, "decode", victim, decode_addresses,
                           cluster.addresses("decode"))


def test_kill_prefill_worker_under_streaming_load(cluster):
    client = openai.OpenAI(base_url=cluster.url + "/v1", api_key="x", timeout=120,
                           max_retries=0)
    prefill_addresses = cluster.addresses("prefill")
    retries_before = cluster.metric("sluice_router_retries_total")
    dropped_before = cluster.metric("sluice_router_workers_dropped_total")
    victim = cluster.workers["prefill-0"]
    events = {}
    # A steady flow: 8 clients, each streaming one request after another, so prefills are in
    # flight and new requests keep arriving when the worker dies.
    clients, per_client = 8, 3
    n = clients * per_client

    def client_loop(k):
        return [stream(client, k * per_client + j, events) for j in range(per_client)]

    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        futures = [pool.submit(client_loop, k) for k in range(clients)]
        wait_until(lambda: len(events) >= clients, 120, "streams producing tokens")
        killed_at = time.monotonic()
        victim.kill9()
        results = [r for f in futures for r in f.result(timeout=180)]
    assert time.monotonic() - killed_at < 90
    errors = [r for r in results if r[0] == "error"]
    assert len(results) == n
    # No request fails: one whose prefill was in flight is retried on the other prefill worker;
    # one whose first token was already sent but whose KV the decode worker could not pull from
    # the dead worker has its prompt recomputed on the decode worker.
    assert not errors, f"{len(errors)} of {n} failed: {errors}"
    assert all(r[2] >= 1 for r in results)
    recomputed = sum(cluster.worker_metric(name, "sluice_decode_transfers_recomputed_total")
                     for name in cluster.workers if name.startswith("decode"))
    # The router dropped the worker on its failed connection (a probe), not at the lease's end.
    wait_until(lambda: len(cluster.addresses("prefill")) == 1, 15, "router dropping the worker")
    assert cluster.metric("sluice_router_workers_dropped_total") >= dropped_before + 1
    assert "is unreachable (connection failed)" in cluster.router.log_path.read_text()
    print(f"\nprefill kill: {n} of {n} completed, "
          f"{cluster.metric('sluice_router_retries_total') - retries_before:.0f} retried on the "
          f"other prefill worker, {recomputed:.0f} recomputed on a decode worker")
    assert_restart_rejoins(cluster, client, "prefill", victim, prefill_addresses,
                           cluster.addresses("prefill"))
