"""Prefill and decode workers serve /metrics (Prometheus text) and /health on their --http-port.

A router + 1 prefill + 1 decode cluster runs a few greedy chats; then each worker's exposition
passes `promtool check metrics` (only the expected ':' lint of the vLLM-compatible names), carries
the gauges Kubernetes inference gateways read, and its counters/histograms saw the requests:
prefill TTFT, decode ITL, handover, KV transfer latency and bytes, outcomes by status. KV blocks
in use return to zero on both workers.
"""

import concurrent.futures
import shutil

import openai
import pytest

from sluice_cluster import MODEL_NAME, Cluster, promtool_problems, http_get, sum_samples, wait_until

NUM_REQUESTS = 6


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(num_prefill=1, num_decode=1)
    yield c
    c.stop()


def chat(client, i):
    r = client.chat.completions.create(
        model=MODEL_NAME, temperature=0, max_tokens=8,
        messages=[{"role": "user", "content": f"Metrics question {i}: count to {i + 3}."}])
    return r.choices[0].finish_reason


def test_worker_metrics_and_health(cluster):
    client = openai.OpenAI(base_url=cluster.url + "/v1", api_key="x", timeout=120, max_retries=0)
    with concurrent.futures.ThreadPoolExecutor(NUM_REQUESTS) as pool:
        reasons = list(pool.map(lambda i: chat(client, i), range(NUM_REQUESTS)))
    assert all(r in ("stop", "length") for r in reasons), reasons

    for name in ("prefill-0", "decode-0"):
        base = cluster.metrics_urls[name].rsplit("/", 1)[0]
        status, body = http_get(base + "/health")
        assert status == 200 and '"ok"' in body, (name, status, body)
        wait_until(lambda: cluster.worker_metric(name, "sluice_kv_cache_used_blocks") == 0 and
                   cluster.worker_metric(name, "sluice_kv_cache_blocks") > 0, 30,
                   f"{name} KV blocks back to free")
        text = cluster.worker_metrics_text(name)
        if shutil.which("promtool"):
            assert promtool_problems(text) == [], text
        m = lambda metric: sum_samples(text, metric)
        # Gateway gauges (vLLM names) agree with ours.
        total = m("sluice_kv_cache_blocks")
        assert m("vllm:kv_cache_usage_perc") == 0.0
        assert m("vllm:num_requests_waiting") == 0 and m("vllm:num_requests_running") == 0
        assert f'vllm:cache_config_info{{block_size="{int(m("sluice_kv_cache_block_size_tokens"))}"' \
               f',num_gpu_blocks="{int(total)}"}} 1' in text
        assert f'sluice_worker_healthy{{role="{name.split("-")[0]}"}} 1' in text
        assert m("sluice_kv_cache_free_blocks") == total
        assert 'sluice_worker_requests_total{status="ok"}' in text

    prefill = cluster.worker_metrics_text("prefill-0")
    decode = cluster.worker_metrics_text("decode-0")
    assert sum_samples(prefill, "sluice_time_to_first_token_seconds_count") == NUM_REQUESTS
    assert sum_samples(prefill, "sluice_prefill_held_blocks") == 0
    assert sum_samples(prefill, 'sluice_worker_requests_total') == NUM_REQUESTS
    assert sum_samples(decode, "sluice_decode_reserved_transfers") == 0
    # Every request's KV was pulled once by the decode worker, then one handover each.
    assert sum_samples(decode, "sluice_kv_transfer_seconds_count") == NUM_REQUESTS
    assert 'sluice_kv_transfers_total{result="ok"} %d' % NUM_REQUESTS in decode
    assert sum_samples(decode, "sluice_kv_handover_seconds_count") == NUM_REQUESTS
    assert sum_samples(decode, "sluice_inter_token_latency_seconds_count") > 0
    pulled = [line for line in decode.splitlines()
              if line.startswith('sluice_kv_transfer_bytes_total{direction="pull"}')]
    assert len(pulled) == 1 and float(pulled[0].split()[1]) > 0, pulled


def test_worker_http_errors(cluster):
    base = cluster.metrics_urls["decode-0"].rsplit("/", 1)[0]
    import urllib.error
    import urllib.request
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(base + "/nope", timeout=5)
    assert e.value.code == 404
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(urllib.request.Request(base + "/metrics", data=b"x",
                                                      method="POST"), timeout=5)
    assert e.value.code == 405
