"""Decode-side failures after the first token, and a full decode tier (router + prefill + decode).

1. kill -9 a decode worker while its requests have their first token (from prefill) but before it
   streamed anything (the router's test-only --test-decode-start-delay-ms holds the first Decode
   call; the test kills once every stream has its first token, inside that window): every request
   completes on the other decode worker, which pulls the same pinned prefill KV, and the text
   equals `sluice serve` (one seamless stream). Every pin is released by an ack, none expires.
2. Two decode workers with very few KV blocks under 32 concurrent requests: Reserve finds no free
   blocks, the router tries the other worker, then waits with backoff; no request fails, the texts
   equal `sluice serve`, and the router counts the full answers (none timed out in the queue).
3. The same with ~100-token prompts (one request's reservation fills a decode worker: blocks are
   reserved for a prefill that runs or answered, prompt + 1 tokens) and a 0.3 s
   --decode-queue-timeout-s: requests that find no blocks in time get a 503 saying so, counted in
   sluice_router_decode_queue_timeouts_total; the rest equal `sluice serve`, every pin is released.
"""

import concurrent.futures
import json
import re
import time

import openai
import pytest

from sluice_cluster import MODEL_NAME, Cluster, Serve, sum_samples, wait_until

MAX_TOKENS = 24
DECODE_START_DELAY_MS = 8000  # the kill window; the test does not sleep through it
SMALL_DECODE = ["--num-kv-blocks", "8", "--max-model-len", "128", "--reserve-timeout-s", "3"]
NUM_QUEUED = 32  # test 2: ~8 rounds of 4 requests on the two small decode workers


def messages(i):
    return [{"role": "user", "content": f"Request {i}: list {i % 5 + 2} kinds of trees."}]


def hundred_token_messages(i):
    """About 100 prompt tokens: prompt + 1 takes 7 of a small decode worker's 8 blocks."""
    return [{"role": "user", "content": f"Request {i}: " + " ".join(f"word{k}" for k in range(43))}]


def complete(client, i, max_tokens=MAX_TOKENS, make_messages=messages):
    r = client.chat.completions.create(model=MODEL_NAME, messages=make_messages(i), temperature=0,
                                       max_tokens=max_tokens)
    return r.choices[0].message.content, r.choices[0].finish_reason


def stream(client, i, first_token_at):
    """Streams request i; records when its first content arrived; returns (text, finish)."""
    text, finish = "", None
    s = client.chat.completions.create(model=MODEL_NAME, messages=messages(i), temperature=0,
                                       max_tokens=MAX_TOKENS, stream=True)
    for chunk in s:
        if not chunk.choices:
            continue
        if chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
            first_token_at.setdefault(i, time.monotonic())
        finish = chunk.choices[0].finish_reason or finish
    return text, finish


@pytest.fixture(scope="module")
def reference():
    s = Serve()
    client = openai.OpenAI(base_url=s.url + "/v1", api_key="x", timeout=120, max_retries=0)
    with concurrent.futures.ThreadPoolExecutor(NUM_QUEUED) as pool:
        outputs = list(pool.map(lambda i: complete(client, i), range(NUM_QUEUED)))
    s.stop()
    return outputs


def listen_address(proc):
    return proc.args[proc.args.index("--listen") + 1]


def recompute_lines(cluster, name):
    """The `recompute {json}` log lines of worker `name` (services/common/recompute_log.h)."""
    text = cluster.workers[name].log_path.read_text(errors="replace")
    return [json.loads(m) for m in re.findall(r" recompute (\{.*\})$", text, re.M)]


def prefill_pins_released(cluster, name="prefill-0"):
    """The prefill worker holds no pin, and none was freed by its timeout."""
    def released():
        return cluster.worker_metric(name, "sluice_prefill_held_blocks") == 0
    wait_until(released, 10, "prefill pins released")
    text = cluster.worker_metrics_text(name)
    assert 'sluice_prefill_held_released_total{reason="expired"} 0' in text, text


def test_kill_decode_worker_after_first_token_completes_elsewhere(reference):
    n = 8
    cluster = Cluster(num_prefill=1, num_decode=2,
                      router_args=["--test-decode-start-delay-ms", str(DECODE_START_DELAY_MS)])
    try:
        client = openai.OpenAI(base_url=cluster.url + "/v1", api_key="x", timeout=120,
                               max_retries=0)
        first_token_at = {}
        with concurrent.futures.ThreadPoolExecutor(n) as pool:
            futures = [pool.submit(stream, client, i, first_token_at) for i in range(n)]
            wait_until(lambda: len(first_token_at) == n or any(f.done() for f in futures), 60,
                       "every stream's first token")
            assert len(first_token_at) == n, [f.result() for f in futures if f.done()]
            # Inside the window: no Decode call has started yet.
            assert time.monotonic() - min(first_token_at.values()) < DECODE_START_DELAY_MS / 1e3
            assigned = {w["address"]: w["assigned"] for w in cluster.workers_json()
                        if w["role"] == "decode"}
            # Kill the decode worker that holds the most of them.
            name = max(("decode-0", "decode-1"), key=lambda k: assigned[listen_address(
                cluster.workers[k])])
            moved = assigned[listen_address(cluster.workers[name])]
            cluster.workers[name].kill9()
            outputs = [f.result(timeout=120) for f in futures]
        expected = [(reference[i][0], reference[i][1]) for i in range(n)]
        assert outputs == expected
        # Every request of the killed worker moved, each once; none failed.
        retried = cluster.metric("sluice_router_decode_retries_pinned_kv_total")
        assert moved >= 1 and retried == moved, assigned
        assert cluster.metric("sluice_router_worker_failures_total") == 0
        prefill_pins_released(cluster)
        print(f"\ndecode kill after first token: {retried:.0f} of {n} requests moved to the "
              f"other decode worker (assigned before the kill: {assigned})")
    finally:
        cluster.stop()


def test_full_decode_workers_queue_instead_of_503(reference):
    n = NUM_QUEUED
    # 8 blocks of 16 tokens: one request needs up to 3 (~20 prompt + 24 tokens), so each worker
    # runs two or three at a time and most Reserve calls find it full. The router holds each
    # Decode 700 ms after its reservation, longer than a Reserve waits for blocks (500 ms), so
    # the tier is full however fast the workers decode.
    cluster = Cluster(num_prefill=1, num_decode=2, role_args={"decode": SMALL_DECODE},
                      router_args=["--test-decode-start-delay-ms", "700"])
    try:
        client = openai.OpenAI(base_url=cluster.url + "/v1", api_key="x", timeout=120,
                               max_retries=0)
        start = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(n) as pool:
            outputs = list(pool.map(lambda i: complete(client, i), range(n)))
        elapsed = time.monotonic() - start
        assert outputs == reference[:n]
        full = cluster.metric("sluice_router_decode_reserve_full_total")
        assert full >= 1
        assert cluster.metric("sluice_router_decode_queue_timeouts_total") == 0
        assert cluster.metric("sluice_router_worker_failures_total") == 0
        prefill_pins_released(cluster)
        # A reservation replaced or left unused is cancelled by an RPC of its own, after the
        # request may have ended: a bounded wait.
        for name in ("decode-0", "decode-1"):
            wait_until(lambda: sum_samples(cluster.worker_metrics_text(name),
                                           "sluice_decode_reserved_transfers") == 0, 10,
                       f"{name}: no reservation left")
        print(f"\nfull decode tier: {n} requests in {elapsed:.1f}s, {full:.0f} Reserve answers "
              "without blocks, 0 failed")
    finally:
        cluster.stop()


# Test 3: a ~100-token prompt's reservation (prompt + 1) takes 7 of a small decode worker's 8
# blocks, so each decode worker holds one request at a time; 24 more tokens fit in 128.
LONG_TOKENS = 24


def test_decode_queue_timeout_is_a_clear_503():
    # Also the regression test of a decode-engine stall: with the KV cache no larger than one
    # max-length sequence, a completed transfer waiting behind a preempted head held its blocks
    # while the head could not fit (1 run in ~6 hung for 120 s before Scheduler's fix).
    serve = Serve()
    try:
        ref_client = openai.OpenAI(base_url=serve.url + "/v1", api_key="x", timeout=120,
                                   max_retries=0)
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            reference = list(pool.map(
                lambda i: complete(ref_client, i, LONG_TOKENS, hundred_token_messages),
                range(NUM_QUEUED)))
    finally:
        serve.stop()
    # The router holds each Decode 700 ms after its reservation, so a worker keeps its one
    # request's blocks longer than the 300 ms queue wait however fast it decodes (a fast engine
    # otherwise served all 32 within the wait).
    cluster = Cluster(num_prefill=1, num_decode=2, role_args={"decode": SMALL_DECODE},
                      router_args=["--decode-queue-timeout-s", "0.3",
                                   "--test-decode-start-delay-ms", "700"])
    try:
        client = openai.OpenAI(base_url=cluster.url + "/v1", api_key="x", timeout=60,
                               max_retries=0)

        def attempt(i):
            try:
                return complete(client, i, LONG_TOKENS, hundred_token_messages)
            except openai.APIStatusError as e:
                return e.status_code, e.message

        with concurrent.futures.ThreadPoolExecutor(NUM_QUEUED) as pool:
            outputs = list(pool.map(attempt, range(NUM_QUEUED)))
        refused = [o for o in outputs if o[0] == 503]
        assert refused, "32 requests on 2 tiny decode workers: some must time out in 0.3 s"
        assert all("no decode worker had free KV blocks for this request" in msg and
                   "within 300ms of waiting" in msg for _, msg in refused), refused[0]
        assert all(outputs[i] == reference[i] for i in range(NUM_QUEUED)
                   if outputs[i][0] != 503)
        assert cluster.metric("sluice_router_decode_queue_timeouts_total") == len(refused)
        prefill_pins_released(cluster)
        # Every preemption on the tiny decode workers is logged with its cause, as counted.
        for name in ("decode-0", "decode-1"):
            preempted = [line for line in recompute_lines(cluster, name) if line["preempted"]]
            text = cluster.worker_metrics_text(name)
            for cause in ("out_of_kv_blocks", "waiting_head_blocked"):
                counted = sum_samples(text, f'sluice_preemptions_total{{cause="{cause}"}}')
                logged = [line for line in preempted if line["cause"] == cause]
                assert counted == len(logged), (name, cause, counted, logged)
                assert all(line["blocks_freed"] > 0 and line["needed_by"] for line in logged), \
                    logged
    finally:
        cluster.stop()


def test_pull_after_the_pin_ended_is_recomputed_not_trusted(reference):
    """The decode worker pulls only after the prefill worker's pin expired (1 s pin, Decode held
    3 s by the router's test delay): the pulled blocks may have been reused, so the failed ack
    (nothing pinned) makes decode recompute the prompt. Outputs still equal `sluice serve`."""
    n = 4
    cluster = Cluster(num_prefill=1, num_decode=1,
                      role_args={"prefill": ["--kv-pin-timeout-s", "1"]},
                      router_args=["--test-decode-start-delay-ms", "3000"])
    try:
        client = openai.OpenAI(base_url=cluster.url + "/v1", api_key="x", timeout=120,
                               max_retries=0)
        with concurrent.futures.ThreadPoolExecutor(n) as pool:
            outputs = list(pool.map(lambda i: stream(client, i, {}), range(n)))
        assert outputs == [(reference[i][0], reference[i][1]) for i in range(n)]
        recomputed = cluster.worker_metric("decode-0", "sluice_decode_transfers_recomputed_total")
        expired = sum_samples(cluster.worker_metrics_text("prefill-0"),
                              'sluice_prefill_held_released_total{reason="expired"}')
        assert expired == n and recomputed == n, (expired, recomputed)
        # Each recompute is counted and logged with its reason: the pin was gone.
        decode = cluster.worker_metrics_text("decode-0")
        assert sum_samples(decode, 'sluice_decode_recomputes_total{reason="pin_gone"}') == n
        assert sum_samples(decode, "sluice_decode_recomputes_total") == n
        # One line per request: its id, the reason, the reserved blocks given back (prompt + 1
        # tokens' worth) and the prompt tokens to compute again.
        lines = recompute_lines(cluster, "decode-0")
        assert len(lines) == n, lines
        assert len({line["request_id"] for line in lines}) == n
        block_size = cluster.worker_metric("decode-0", "sluice_kv_cache_block_size_tokens")
        for line in lines:
            assert line["cause"] == "pin_gone" and line["preempted"] is False, line
            assert line["tokens_to_recompute"] > 0, line
            assert line["blocks_freed"] == -(-(line["tokens_to_recompute"] + 1) // block_size)
            assert line["source"] and "could not be confirmed" in line["detail"], line
        wait_until(lambda: cluster.worker_metric("decode-0", "sluice_kv_cache_free_blocks") ==
                   cluster.worker_metric("decode-0", "sluice_kv_cache_blocks"), 10,
                   "decode blocks free")
    finally:
        cluster.stop()


def long_messages(i):
    body = " ".join(f"tree{(i * 7 + j) % 97}" for j in range(350))
    return [{"role": "user", "content": f"Request {i}: {body}. Name one tree."}]


def test_prefill_slower_than_the_decode_reservation_reserves_again():
    """A decode reservation lasts --reserve-timeout-s (2.1 s here) and the router counts on 2 s of
    it for the Decode call's way: a prefill that started at once (idle prefill worker: reserved in
    parallel) and took longer than 0.1 s answers after its reservation (nearly) ran out. Six long
    prompts on one prefill worker (the queued ones reserve only once prefill answered). The router
    reserves again (it knows the timeout: --decode-reserve-timeout-s) instead of sending a Decode
    that would meet an expired reservation: every request completes, equal to `sluice serve`."""
    n = 6
    serve = Serve()
    try:
        ref_client = openai.OpenAI(base_url=serve.url + "/v1", api_key="x", timeout=120,
                                   max_retries=0)
        expected = [ref_client.chat.completions.create(
            model=MODEL_NAME, messages=long_messages(i), temperature=0,
            max_tokens=8).choices[0].message.content for i in range(n)]
    finally:
        serve.stop()
    cluster = Cluster(num_prefill=1, num_decode=1,
                      role_args={"decode": ["--reserve-timeout-s", "2.1"]},
                      router_args=["--decode-reserve-timeout-s", "2.1"])
    try:
        client = openai.OpenAI(base_url=cluster.url + "/v1", api_key="x", timeout=120,
                               max_retries=0)

        def run(i):
            return client.chat.completions.create(
                model=MODEL_NAME, messages=long_messages(i), temperature=0,
                max_tokens=8).choices[0].message.content

        with concurrent.futures.ThreadPoolExecutor(n) as pool:
            outputs = list(pool.map(run, range(n)))
        assert outputs == expected
        rereserves = cluster.metric("sluice_router_decode_rereserves_total")
        print(f"\n{rereserves:.0f} reservations made again for {n} requests")
        assert rereserves >= 1
        wait_until(lambda: cluster.worker_metric("decode-0", "sluice_kv_cache_free_blocks") ==
                   cluster.worker_metric("decode-0", "sluice_kv_cache_blocks"), 10,
                   "decode blocks free")
    finally:
        cluster.stop()
