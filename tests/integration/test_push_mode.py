"""KV push mode (`--kv-transfer-mode push` on every worker): the prefill worker RMA-writes the
prompt KV into the blocks the decode worker reserved (PrefillWorker.PushKv) instead of decode
pulling it.

1. 20 concurrent greedy chats through the router (1 prefill + 1 decode, push) equal what
   `sluice serve` returns (the pushed KV is right); the pushes show in the workers' metrics and
   every KV block is free afterwards.
2. A mode mismatch (prefill push, decode pull) is refused when the worker registers (it exits
   non-zero naming both modes); one that reaches a request (a worker from before the check)
   fails it with a server error naming both modes, without a retry, and frees the blocks on both
   workers.
"""

import concurrent.futures

import openai
import pytest

from sluice_cluster import MODEL_NAME, Cluster, Serve, sum_samples, wait_until

NUM_REQUESTS = 20
MAX_TOKENS = 12


def messages(i):
    return [{"role": "user", "content": f"Push {i}: list {i % 5 + 2} animals that can swim."}]


def complete(client, i):
    r = client.chat.completions.create(model=MODEL_NAME, messages=messages(i), temperature=0,
                                       max_tokens=MAX_TOKENS)
    return r.choices[0].message.content, r.choices[0].finish_reason, r.usage.completion_tokens


def run_all(url):
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", timeout=120, max_retries=0)
    with concurrent.futures.ThreadPoolExecutor(NUM_REQUESTS) as pool:
        return list(pool.map(lambda i: complete(client, i), range(NUM_REQUESTS)))


def wait_blocks_free(cluster):
    def free():
        return all(cluster.worker_metric(name, "sluice_kv_cache_used_blocks") == 0
                   for name in cluster.workers)
    wait_until(free, 15, "KV blocks free on every worker")


def test_push_mode_matches_sluice_serve():
    serve = Serve()
    try:
        reference = run_all(serve.url)
    finally:
        serve.stop()
    cluster = Cluster(num_prefill=1, num_decode=1, worker_args=("--kv-transfer-mode", "push"))
    try:
        outputs = run_all(cluster.url)
        mismatches = [i for i in range(NUM_REQUESTS) if outputs[i] != reference[i]]
        assert not mismatches, (f"{len(mismatches)} differ, first {mismatches[0]}: "
                                f"{outputs[mismatches[0]]} vs {reference[mismatches[0]]}")
        wait_blocks_free(cluster)
        prefill = cluster.worker_metrics_text("prefill-0")
        decode = cluster.worker_metrics_text("decode-0")
        # Prefill pushed every request's KV (one transfer each); decode pulled nothing.
        pushes = sum_samples(prefill, "sluice_kv_transfer_seconds_count")
        finished_by_prefill = NUM_REQUESTS - sum_samples(decode, "sluice_kv_handover_seconds_count")
        assert pushes == NUM_REQUESTS - finished_by_prefill, (pushes, finished_by_prefill)
        assert 'sluice_kv_transfers_total{result="failed"} 0' in prefill
        assert 'sluice_kv_transfer_bytes_total{direction="push"} 0' not in prefill
        assert 'sluice_kv_transfer_bytes_total{direction="pull"} 0' in decode
        assert sum_samples(prefill, "sluice_prefill_held_blocks") == 0
        assert 'sluice_prefill_held_released_total{reason="expired"} 0' in prefill
    finally:
        cluster.stop()


def test_mode_mismatch_is_a_clear_error():
    """A decode worker that registers without its KV settings (as one from before the router's
    check) pulls while the prefill worker pushes: the request fails with a server error (500,
    not the client's 400) naming both modes, is not retried, and every block is freed. A pull
    decode worker that reports its settings is refused by the router at registration and exits
    non-zero, saying why; the pool goes on serving."""
    cluster = Cluster(num_prefill=1, num_decode=1,
                      role_args={"prefill": ["--kv-transfer-mode", "push"],
                                 "decode": ["--kv-transfer-mode", "pull",
                                            "--test-register-without-kv-peer"]})
    try:
        client = openai.OpenAI(base_url=cluster.url + "/v1", api_key="x", timeout=60,
                               max_retries=0)
        with pytest.raises(openai.InternalServerError) as e:
            complete(client, 1)
        assert e.value.status_code == 500
        assert e.value.body["type"] == "server_error", e.value.body
        message = e.value.body["message"]
        assert message.startswith("the KV transfer between this request's workers failed: "
                                  "KV transfer mode mismatch: decode worker runs "
                                  "--kv-transfer-mode pull, prefill worker 127.0.0.1:"), message
        assert message.endswith(" runs push; start every worker with the same "
                                "--kv-transfer-mode"), message
        assert cluster.metric('sluice_router_retries_total{stage="decode"}') == 0
        assert cluster.metric("sluice_router_migrations_total") == 0
        wait_blocks_free(cluster)
        assert sum_samples(cluster.worker_metrics_text("prefill-0"),
                           "sluice_prefill_held_blocks") == 0

        refused = cluster.start_worker("decode-pull", "decode", ["--kv-transfer-mode", "pull"])
        assert refused.proc.wait(timeout=120) == 1, refused.tail()
        prefill = next(w for w in cluster.workers_json() if w["role"] == "prefill")
        # "... decode worker 127.0.0.1:PORT" and then:
        why = (f" runs --kv-transfer-mode pull but the registered prefill worker {prefill['id']} "
               f"({prefill['address']}) runs --kv-transfer-mode push; start every prefill and "
               f"decode worker with the same --kv-transfer-mode")
        log = refused.log_path.read_text(errors="replace")
        # The refusal is said once: by the worker, then the router's reason.
        assert (f"exiting: the router at 127.0.0.1:{cluster.grpc_port} refused this decode "
                f"worker: KV transfer mode mismatch: decode worker 127.0.0.1:") in log, refused.tail()
        assert why in log, refused.tail()
        assert "refuses" not in log, refused.tail()
        router_log = cluster.router.log_path.read_text(errors="replace")
        assert ("[error] refused decode worker 127.0.0.1:" in router_log and
                ": KV transfer mode mismatch: decode worker 127.0.0.1:" in router_log), router_log
        assert why in router_log
        assert [w["role"] for w in cluster.workers_json()].count("decode") == 1
        # The pool is not closed: a decode worker that agrees with it joins.
        cluster.start_worker("decode-push", "decode", ["--kv-transfer-mode", "push"])
        wait_until(lambda: [w["role"] for w in cluster.workers_json()].count("decode") == 2,
                   120, "the push decode worker registered")
        modes = sorted((w["role"], w.get("kv_transfer_mode", "-")) for w in cluster.workers_json())
        assert modes == [("decode", "-"), ("decode", "push"), ("prefill", "push")], modes
    finally:
        cluster.stop()
