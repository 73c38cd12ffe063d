"""SWA bounded replay through the router (1 prefill + 1 decode) on the hybrid model
../shared/models/sluice-mini-swa (8 layers: 6 sliding-window, window 64, and 2 full-attention).

With --swa-replay-tokens R > 0 (default 128) the prefill worker announces that only the
full-attention layers' KV is moved, the decode worker pulls only those layers' regions and replays
the last R prompt tokens to rebuild the sliding layers before its first decode step.

1. Prompts of at most R tokens (the replay covers the whole prompt, so it is exact): greedy outputs
   through the router equal `sluice serve`'s, with replay on and off.
2. sluice_kv_transfer_bytes_total{direction="pull"} with replay on is exactly 2/8 of replay off
   for the same requests (same blocks; only 2 of 8 layers' K/V regions move).
3. R = 8 (below the window) in push and layerwise mode with prompts of several hundred tokens:
   every request completes with max_tokens tokens, the decode worker replayed 8 tokens per
   request and the prefill worker pushed only the full-attention layers' bytes. No equality
   claim.

KV bytes per token on sluice-mini-swa (float32; 2 KV heads x 64 dims; K and V): 8 layers x 1024 B
= 8192 B without replay, 2 x 1024 B = 2048 B with it; transfers move whole 16-token blocks.
"""

import math

import concurrent.futures

import openai
import pytest

from sluice_cluster import REPO, Cluster, Serve, wait_until

MODEL_DIR = (REPO.parent / "shared" / "models" / "sluice-mini-swa").resolve()
MODEL_NAME = "sluice-mini-swa"
MAX_TOKENS = 16
NUM_LAYERS, NUM_FULL_LAYERS = 8, 2
BLOCK_SIZE = 16
LAYER_BYTES_PER_TOKEN = 2 * 2 * 64 * 4  # K and V, 2 KV heads x 64 dims, float32
# Token-id prompts of lengths up to R = 128 (replay exact), a few crossing block boundaries.
SHORT_LENGTHS = (5, 16, 17, 40, 64, 100, 127)
LONG_LENGTHS = (300, 450, 601)
PULLED = 'sluice_kv_transfer_bytes_total{direction="pull"}'

pytestmark = pytest.mark.skipif(not MODEL_DIR.is_dir(), reason=f"{MODEL_DIR} missing")


def prompt(length, salt=0):
    return [10 + (i * 131 + salt * 17 + i // 5) % 4000 for i in range(length)]


def complete_all(url, prompts):
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", timeout=120, max_retries=0)

    def one(p):
        r = client.completions.create(model=MODEL_NAME, prompt=p, temperature=0,
                                      max_tokens=MAX_TOKENS, extra_body={"ignore_eos": True})
        return r.choices[0].text, r.choices[0].finish_reason, r.usage.completion_tokens

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        return list(pool.map(one, prompts))


def block_tokens(lengths):
    """Prompt tokens rounded up to whole blocks: what a transfer moves."""
    return sum(math.ceil(n / BLOCK_SIZE) * BLOCK_SIZE for n in lengths)


def cluster_with(replay_tokens, mode="pull"):
    return Cluster(num_prefill=1, num_decode=1, model_dir=MODEL_DIR,
                   worker_args=("--swa-replay-tokens", str(replay_tokens),
                                "--kv-transfer-mode", mode),
                   router_args=("--min-remote-prefill-tokens", "1"))


def pulled_after(cluster, expect_transfers):
    """Decode's pulled bytes once its `expect_transfers` pulls are counted."""
    wait_until(lambda: cluster.worker_metric("decode-0", 'sluice_kv_transfers_total') >=
               expect_transfers, 15, "transfers counted")
    return cluster.worker_metric("decode-0", PULLED)


@pytest.fixture(scope="module")
def reference():
    serve = Serve(model_dir=MODEL_DIR)
    try:
        return complete_all(serve.url, [prompt(n) for n in SHORT_LENGTHS])
    finally:
        serve.stop()


def run_short(replay_tokens):
    cluster = cluster_with(replay_tokens)
    try:
        outputs = complete_all(cluster.url, [prompt(n) for n in SHORT_LENGTHS])
        pulled = pulled_after(cluster, len(SHORT_LENGTHS))
        replayed = cluster.worker_metric("decode-0", "sluice_decode_swa_replayed_tokens_total")
        return outputs, pulled, replayed
    finally:
        cluster.stop()


def test_replay_matches_serve_and_moves_only_full_layers(reference):
    on, pulled_on, replayed_on = run_short(128)
    off, pulled_off, replayed_off = run_short(0)
    for n, got, want in zip(SHORT_LENGTHS, on, reference):
        assert got == want, f"replay on, prompt of {n} tokens: {got} vs serve {want}"
    for n, got, want in zip(SHORT_LENGTHS, off, reference):
        assert got == want, f"replay off, prompt of {n} tokens: {got} vs serve {want}"
    assert replayed_on == sum(SHORT_LENGTHS)  # R = 128 covers each whole prompt
    assert replayed_off == 0
    tokens = block_tokens(SHORT_LENGTHS)
    print(f"\nKV bytes pulled for {tokens} block tokens: replay off {pulled_off:.0f} "
          f"({pulled_off / tokens:.0f} B/token), on {pulled_on:.0f} "
          f"({pulled_on / tokens:.0f} B/token)")
    assert pulled_off == tokens * NUM_LAYERS * LAYER_BYTES_PER_TOKEN
    # Same prompts, same blocks: only the full-attention layers' regions (2 of 8) move.
    assert pulled_on * NUM_LAYERS == pulled_off * NUM_FULL_LAYERS, (pulled_on, pulled_off)


@pytest.mark.parametrize("mode", ["push", "layerwise"])
def test_short_replay_below_window_completes_in_push_mode(mode):
    # layerwise: the sliding layers' groups have nothing to move; only the full layers' pushes run
    cluster = cluster_with(8, mode=mode)
    try:
        outputs = complete_all(cluster.url, [prompt(n, salt=3) for n in LONG_LENGTHS])
        for n, (text, finish, tokens) in zip(LONG_LENGTHS, outputs):
            assert finish == "length" and tokens == MAX_TOKENS, (n, text, finish, tokens)
            assert text, f"prompt of {n} tokens: empty completion"
        assert cluster.worker_metric(
            "decode-0", "sluice_decode_swa_replayed_tokens_total") == 8 * len(LONG_LENGTHS)
        assert cluster.worker_metric("decode-0", "sluice_decode_transfers_recomputed_total") == 0
        pushed = cluster.worker_metric("prefill-0",
                                       'sluice_kv_transfer_bytes_total{direction="push"}')
        assert pushed == block_tokens(LONG_LENGTHS) * NUM_FULL_LAYERS * LAYER_BYTES_PER_TOKEN
    finally:
        cluster.stop()


def test_replay_mismatch_is_a_clear_error():
    """Prefill moves only full-attention layers, decode expects every layer. A decode worker
    that registers without its KV settings (as one from before the router's check): the request
    fails with a server error (500) naming both --swa-replay-tokens values (never decodes on
    missing sliding-layer KV), without a retry, and every block is freed. One that reports them
    is refused at registration and exits non-zero naming both values."""
    cluster = Cluster(num_prefill=1, num_decode=1, model_dir=MODEL_DIR,
                      role_args={"prefill": ["--swa-replay-tokens", "128"],
                                 "decode": ["--swa-replay-tokens", "0",
                                            "--test-register-without-kv-peer"]},
                      router_args=("--min-remote-prefill-tokens", "1"))
    try:
        with pytest.raises(openai.InternalServerError) as e:
            complete_all(cluster.url, [prompt(40)])
        assert e.value.status_code == 500
        message = e.value.body["message"]
        assert message.startswith("the KV transfer between this request's workers failed: "
                                  "SWA replay mismatch: prefill worker 127.0.0.1:"), message
        assert message.endswith(" runs --swa-replay-tokens 128 (moves only full-attention "
                                "layers) but this decode worker runs --swa-replay-tokens 0; "
                                "start every worker with the same --swa-replay-tokens"), message
        assert cluster.metric('sluice_router_retries_total{stage="decode"}') == 0
        wait_until(lambda: all(cluster.worker_metric(name, "sluice_kv_cache_used_blocks") == 0
                               for name in cluster.workers), 15, "KV blocks free")

        refused = cluster.start_worker("decode-no-replay", "decode",
                                       ["--swa-replay-tokens", "0"])
        assert refused.proc.wait(timeout=120) == 1, refused.tail()
        prefill = next(w for w in cluster.workers_json() if w["role"] == "prefill")
        why = (f" runs --swa-replay-tokens 0 (moves every layer) but the registered prefill "
               f"worker {prefill['id']} ({prefill['address']}) runs --swa-replay-tokens 128 "
               f"(moves only full-attention layers)")
        assert why in refused.log_path.read_text(errors="replace"), refused.tail()
        assert why in cluster.router.log_path.read_text(errors="replace")
    finally:
        cluster.stop()
