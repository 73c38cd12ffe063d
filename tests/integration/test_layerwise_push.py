"""Layer-by-layer KV push (`--kv-transfer-mode layerwise` on every worker): the router reserves
decode blocks before the Prefill call and passes them along; the prefill worker pushes each
layer's KV into them as its forward completes the layer (the transfer overlaps the later
layers' compute) and answers once every layer landed; decode only acks and decodes.

1. Concurrent greedy chats, short and long (a long one spans several prefill chunks), through
   the router (1 prefill + 1 decode, layerwise) equal what `sluice serve` returns; every
   continuing request's KV moved by the prefill worker's layerwise push (decode moved nothing)
   and every KV block is free afterwards on both workers.
2. A failing layer push (the prefill worker's test hook fails layer group 1) fails that prefill
   cleanly: its pinned blocks are freed, the router falls back to a prefill on the decode worker
   (same tokens), and the decode reservation the push wrote into is freed too.
3. Staged pushes (`--kv-staging on`): the prefill worker's KV is not registered with UCX (as a
   GPU worker's device KV that its UCX cannot reach); every layerwise push, and every PushKv in
   push mode, copies it through two registered host staging slots of 64 KiB (a long prompt's
   layer takes several slot fills) and RMA-writes it from there, up to --kv-staging-transfers
   (3 here) pushes at once, each through its own pair of slots. Same tokens as `sluice serve`,
   every transfer ok, blocks free; a pull-mode prefill worker with staging is refused at start.
4. Staged pulls (`--kv-staging on` on the decode worker, pull mode): the decode worker's KV is
   not registered; every pull RMA-reads the prefill worker's KV into two registered host slots
   of 64 KiB (several slot fills per long prompt; one pair per staged transfer, 4 of them by
   default (--kv-staging-transfers), so concurrent pulls do not wait for each other) and copies
   it from there into the reserved blocks. Same tokens as `sluice serve`, every pulled byte
   through the staging, no failed
   transfer or recompute, blocks free. A staged pull from a prefill worker killed (-9) after
   it answered fails, and the request is recomputed on the decode worker (same tokens), nothing
   counted as staged, every decode block free. A decode worker with staging in push or layerwise mode
   (where prefill would write into its unregistered KV), a slot smaller than a block, and a
   --kv-staging-transfers outside [1, 64], are refused at start.
5. KV layouts that differ (--block-size): a decode worker that reports its settings is refused at
   registration; one that does not (as a worker from before the check) gets the layerwise
   prefill's refusal, a non-retried 500 naming both layouts.
"""

import concurrent.futures
import subprocess

import openai
import pytest

from sluice_cluster import (MODEL_DIR, MODEL_NAME, Cluster, Serve, free_port, sluice_bin,
                            sum_samples, wait_until)

MAX_TOKENS = 12
# Short chats and a few long prompts (hundreds of tokens: several blocks, several chunks).
PROMPTS = ([f"Layer {i}: list {i % 5 + 2} animals that can swim." for i in range(8)] +
           [f"Long {i}: " + " ".join(f"item{(i * 13 + j) % 211}" for j in range(90 + 100 * i))
            for i in range(2)])


def complete(client, prompt):
    r = client.chat.completions.create(model=MODEL_NAME,
                                       messages=[{"role": "user", "content": prompt}],
                                       temperature=0, max_tokens=MAX_TOKENS)
    return r.choices[0].message.content, r.choices[0].finish_reason, r.usage.completion_tokens


def run_all(url, prompts):
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", timeout=300, max_retries=0)
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(lambda p: complete(client, p), prompts))


def wait_blocks_free(cluster, timeout=20):
    def free():
        return all(cluster.worker_metric(name, "sluice_kv_cache_used_blocks") == 0
                   for name in cluster.workers)
    wait_until(free, timeout, "KV blocks free on every worker")


@pytest.fixture(scope="module")
def reference():
    serve = Serve()
    try:
        return run_all(serve.url, PROMPTS)
    finally:
        serve.stop()


def test_layerwise_matches_sluice_serve(reference):
    # Small prefill chunks: the long prompts take several steps, and only the last one pushes.
    cluster = Cluster(num_prefill=1, num_decode=1,
                      worker_args=("--kv-transfer-mode", "layerwise"),
                      role_args={"prefill": ["--max-num-batched-tokens", "128"]})
    try:
        outputs = run_all(cluster.url, PROMPTS)
        mismatches = [i for i in range(len(PROMPTS)) if outputs[i] != reference[i]]
        assert not mismatches, (f"{len(mismatches)} differ, first {mismatches[0]}: "
                                f"{outputs[mismatches[0]]} vs {reference[mismatches[0]]}")
        wait_blocks_free(cluster)
        prefill = cluster.worker_metrics_text("prefill-0")
        decode = cluster.worker_metrics_text("decode-0")
        # Every request decode continued had its KV pushed layer by layer (one transfer each on
        # the prefill worker; a request whose first decode step ended it without a token shows
        # no handover); decode pulled nothing and asked for no push.
        continued = sum_samples(decode, "sluice_kv_handover_seconds_count")
        pushes = sum_samples(prefill, "sluice_kv_transfer_seconds_count")
        assert 0 < continued <= pushes <= len(PROMPTS), (continued, pushes)
        assert sum_samples(decode, "sluice_kv_transfer_seconds_count") == 0
        assert 'sluice_kv_transfers_total{result="failed"} 0' in prefill
        assert 'sluice_kv_transfer_bytes_total{direction="push"} 0' not in prefill
        assert 'sluice_kv_transfer_bytes_total{direction="pull"} 0' in decode
        assert sum_samples(prefill, "sluice_prefill_held_blocks") == 0
        assert 'sluice_prefill_held_released_total{reason="expired"} 0' in prefill
    finally:
        cluster.stop()


def test_failed_layer_push_frees_blocks_on_both_sides(reference):
    cluster = Cluster(num_prefill=1, num_decode=1,
                      worker_args=("--kv-transfer-mode", "layerwise"),
                      role_args={"prefill": ["--test-fail-layer-push", "1"],
                                 "decode": ["--reserve-timeout-s", "3"]})
    try:
        client = openai.OpenAI(base_url=cluster.url + "/v1", api_key="x", timeout=120,
                               max_retries=0)
        # One at a time: the first failure marks the prefill worker suspect for a moment.
        got = [complete(client, PROMPTS[i]) for i in (0, 9)]
        assert got == [reference[0], reference[9]]
        prefill = cluster.worker_metrics_text("prefill-0")
        assert sum_samples(prefill, 'sluice_kv_transfers_total{result="failed"}') >= 1
        assert 'sluice_kv_transfers_total{result="ok"} 0' in prefill
        # The prefill worker freed its pinned blocks at once; the decode worker frees the
        # reservation the push wrote into once no push can reach it (its reservation timeout).
        wait_blocks_free(cluster)
        assert sum_samples(prefill, "sluice_prefill_held_blocks") == 0
    finally:
        cluster.stop()


@pytest.mark.parametrize("mode", ["layerwise", "push"])
def test_staged_push_matches_sluice_serve(reference, mode):
    cluster = Cluster(num_prefill=1, num_decode=1,
                      worker_args=("--kv-transfer-mode", mode),
                      role_args={"prefill": ["--kv-staging", "on",
                                             "--kv-staging-slot-bytes", str(64 << 10),
                                             "--kv-staging-transfers", "3",
                                             "--max-num-batched-tokens", "128"]})
    try:
        outputs = run_all(cluster.url, PROMPTS)
        mismatches = [i for i in range(len(PROMPTS)) if outputs[i] != reference[i]]
        assert not mismatches, (f"{len(mismatches)} differ, first {mismatches[0]}: "
                                f"{outputs[mismatches[0]]} vs {reference[mismatches[0]]}")
        wait_blocks_free(cluster)
        prefill = cluster.worker_metrics_text("prefill-0")
        decode = cluster.worker_metrics_text("decode-0")
        assert ("KV pushes go through pinned host staging slots of 65536 bytes: 2 per transfer, "
                "3 transfers at once" in cluster.workers["prefill-0"].tail(200))
        # Every pushed byte went through the staging, the long prompts' layers in several
        # slot fills each.
        staged = sum_samples(prefill, "sluice_kv_staging_bytes_total")
        assert staged > 0
        assert staged == sum_samples(prefill, 'sluice_kv_transfer_bytes_total{direction="push"}')
        assert (sum_samples(prefill, "sluice_kv_staging_chunks_total") >
                sum_samples(prefill, "sluice_kv_transfer_seconds_count"))
        # The prefill worker's KV is unregistered: a push that bypassed the staging would fail
        # (and the router would recompute on the decode worker, hiding it from the tokens).
        assert 'sluice_kv_transfers_total{result="failed"} 0' in prefill
        assert 'sluice_kv_transfer_bytes_total{direction="push"} 0' not in prefill
        assert 'sluice_kv_transfer_bytes_total{direction="pull"} 0' in decode
        continued = sum_samples(decode, "sluice_kv_handover_seconds_count")
        pushes = sum_samples(prefill, "sluice_kv_transfer_seconds_count")  # layerwise or PushKv
        assert 0 < continued <= pushes <= len(PROMPTS), (continued, pushes)
        assert sum_samples(decode, "sluice_decode_transfers_recomputed_total") == 0
        assert sum_samples(prefill, "sluice_prefill_held_blocks") == 0
    finally:
        cluster.stop()


def test_staged_prefill_refuses_pull_mode():
    proc = subprocess.run(
        [sluice_bin(), "prefill", "--model", str(MODEL_DIR), "--listen",
         f"127.0.0.1:{free_port()}", "--kv-staging", "on", "--kv-transfer-mode", "pull"],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "decode workers cannot pull it" in proc.stdout + proc.stderr


def test_staged_pull_matches_sluice_serve(reference):
    cluster = Cluster(num_prefill=1, num_decode=1,
                      worker_args=("--kv-transfer-mode", "pull"),
                      role_args={"decode": ["--kv-staging", "on",
                                            "--kv-staging-slot-bytes", str(64 << 10)],
                                 "prefill": ["--max-num-batched-tokens", "128"]})
    try:
        outputs = run_all(cluster.url, PROMPTS)
        mismatches = [i for i in range(len(PROMPTS)) if outputs[i] != reference[i]]
        assert not mismatches, (f"{len(mismatches)} differ, first {mismatches[0]}: "
                                f"{outputs[mismatches[0]]} vs {reference[mismatches[0]]}")
        wait_blocks_free(cluster)
        prefill = cluster.worker_metrics_text("prefill-0")
        decode = cluster.worker_metrics_text("decode-0")
        assert ("KV pulls go through pinned host staging slots of 65536 bytes: 2 per transfer, "
                "4 transfers at once" in cluster.workers["decode-0"].tail(200))
        # Every pulled byte went through the staging, the long prompts in several slot fills.
        staged = sum_samples(decode, "sluice_kv_staging_bytes_total")
        assert staged > 0
        assert staged == sum_samples(decode, 'sluice_kv_transfer_bytes_total{direction="pull"}')
        pulls = sum_samples(decode, "sluice_kv_transfer_seconds_count")
        assert 0 < pulls <= len(PROMPTS), pulls
        assert sum_samples(decode, "sluice_kv_staging_chunks_total") > pulls
        # No pull failed and nothing was recomputed (a failed pull would be hidden from the
        # tokens by the recompute).
        assert 'sluice_kv_transfers_total{result="failed"} 0' in decode
        assert sum_samples(decode, "sluice_decode_transfers_recomputed_total") == 0
        assert sum_samples(decode, "sluice_decode_recomputes_total") == 0
        assert sum_samples(decode, "sluice_kv_handover_seconds_count") <= pulls
        assert 'sluice_kv_transfer_bytes_total{direction="push"} 0' in prefill
        assert "sluice_kv_staging_bytes_total" not in prefill
        assert sum_samples(prefill, "sluice_prefill_held_blocks") == 0
        assert 'sluice_prefill_held_released_total{reason="expired"} 0' in prefill
    finally:
        cluster.stop()


def test_staged_pull_from_killed_prefill_recomputes(reference):
    # Every pull waits 2 s before it starts: the prefill worker is killed in between.
    cluster = Cluster(num_prefill=1, num_decode=1,
                      worker_args=("--kv-transfer-mode", "pull"),
                      role_args={"decode": ["--kv-staging", "on",
                                            "--kv-staging-slot-bytes", str(64 << 10),
                                            "--test-transfer-delay-ms", "2000",
                                            "--transfer-timeout-s", "5"]})
    try:
        client = openai.OpenAI(base_url=cluster.url + "/v1", api_key="x", timeout=120,
                               max_retries=0)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            future = pool.submit(complete, client, PROMPTS[9])
            # Prefilled and pinned, waiting for the pull.
            # Polled often: the kill must land inside the 2 s pull delay.
            wait_until(lambda: cluster.worker_metric("prefill-0", "sluice_prefill_held_blocks") > 0,
                       60, "the prefill worker holds the KV", interval=0.02)
            cluster.workers["prefill-0"].kill9()
            assert future.result() == reference[9]
        decode = cluster.worker_metrics_text("decode-0")
        assert sum_samples(decode, "sluice_decode_transfers_recomputed_total") == 1
        assert (sum_samples(decode, 'sluice_decode_recomputes_total{reason="transfer_failed"}') +
                sum_samples(decode, 'sluice_decode_recomputes_total{reason="transfer_timeout"}')
                == 1), decode
        assert 'sluice_kv_transfers_total{result="failed"} 1' in decode
        assert sum_samples(decode, "sluice_kv_staging_bytes_total") == 0
        wait_until(lambda: cluster.worker_metric("decode-0", "sluice_kv_cache_used_blocks") == 0,
                   20, "decode blocks free")
    finally:
        cluster.stop()


@pytest.mark.parametrize("args,message", [
    (["--kv-transfer-mode", "push"], "in push mode the prefill worker writes into it"),
    (["--kv-transfer-mode", "layerwise"], "in layerwise mode the prefill worker writes into it"),
    (["--kv-transfer-mode", "pull", "--kv-staging-slot-bytes", "64"],
     "is smaller than one KV block"),
    (["--kv-transfer-mode", "pull", "--kv-staging-transfers", "0"],
     "--kv-staging-transfers must be in [1, 64] (each staged transfer holds 2 slots of "
     "--kv-staging-slot-bytes of pinned memory), not 0"),
    (["--kv-transfer-mode", "pull", "--kv-staging-transfers", "65"],
     "--kv-staging-transfers must be in [1, 64]"),
])
def test_staged_decode_refuses_what_cannot_work(args, message):
    proc = subprocess.run(
        [sluice_bin(), "decode", "--model", str(MODEL_DIR), "--listen",
         f"127.0.0.1:{free_port()}", "--kv-staging", "on"] + args,
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert message in proc.stdout + proc.stderr


def test_layout_mismatch_is_a_clear_error():
    """KV layouts that differ (--block-size 16 on the prefill worker, 32 on the decode worker).
    A decode worker that registers without its KV settings (as one from before the router's
    check): the layerwise prefill refuses the decode reservation, and the request fails with a
    server error (500) naming both layouts, not retried, every block freed. One that reports them
    is refused at registration and exits non-zero naming both layouts."""
    cluster = Cluster(num_prefill=1, num_decode=1,
                      worker_args=("--kv-transfer-mode", "layerwise"),
                      role_args={"prefill": ["--block-size", "16"],
                                 "decode": ["--block-size", "32", "--reserve-timeout-s", "3",
                                            "--test-register-without-kv-peer"]})
    try:
        client = openai.OpenAI(base_url=cluster.url + "/v1", api_key="x", timeout=60,
                               max_retries=0)
        with pytest.raises(openai.InternalServerError) as e:
            complete(client, PROMPTS[0])
        assert e.value.status_code == 500
        message = e.value.body["message"]
        assert message.startswith("the KV transfer between this request's workers failed: "
                                  "KV layout mismatch for request '"), message
        assert "': decode block_size 32, " in message and "; prefill block_size 16, " in message
        assert cluster.metric('sluice_router_retries_total{stage="prefill"}') == 0
        assert cluster.metric('sluice_router_retries_total{stage="decode"}') == 0
        # The decode reservation is freed once no layer push can reach it (its timeout, 3 s).
        wait_blocks_free(cluster)

        refused = cluster.start_worker("decode-32", "decode", [
            "--kv-transfer-mode", "layerwise", "--block-size", "32"])
        assert refused.proc.wait(timeout=120) == 1, refused.tail()
        log = refused.log_path.read_text(errors="replace")
        assert "KV layout mismatch: decode worker 127.0.0.1:" in log, refused.tail()
        assert " has block_size 32, " in log and ") has block_size 16, " in log, refused.tail()
    finally:
        cluster.stop()
