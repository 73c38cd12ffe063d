"""KV push mode (`--kv-transfer-mode push` on every worker): the prefill worker RMA-writes the
prompt KV into the blocks the decode worker reserved (PrefillWorker.PushKv) instead of decode
pulling it.

1. 20 concurrent greedy chats through the router (1 prefill + 1 decode, push) equal what
   `sluice serve` returns (the pushed KV is right); the pushes show in the workers' metrics and
   every KV block is free afterwards.
2. A mode mismatch (prefill push, decode pull) fails the request with an error naming both modes,
   and frees the blocks on both workers.
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
    cluster = Cluster(num_prefill=1, num_decode=1,
                      role_args={"prefill": ["--kv-transfer-mode", "push"],
                                 "decode": ["--kv-transfer-mode", "pull"]})
    try:
        client = openai.OpenAI(base_url=cluster.url + "/v1", api_key="x", timeout=60,
                               max_retries=0)
        with pytest.raises(openai.APIError) as e:
            complete(client, 1)
        assert "KV transfer mode mismatch" in str(e.value), str(e.value)
        assert "push" in str(e.value) and "pull" in str(e.value)
        wait_blocks_free(cluster)
    finally:
        cluster.stop()
