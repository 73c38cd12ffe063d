"""SWA bounded replay with the kvstore on ../shared/models/sluice-mini-swa (8 layers, 2 of them
full-attention): `sluice serve --kvstore` A computes a prompt and writes its full blocks through
holding only the full-attention layers' K/V (2048 B per token instead of 8192 B); a fresh
`sluice serve` B on the same store loads them, replays the loaded prefix (<= R = 128 tokens, so
exact) to rebuild the sliding layers and computes only the tail: same greedy text as A. A third
`sluice serve --swa-replay-tokens 0` on the same store uses another layout id (every layer, 8192 B
per token): it finds none of those blocks and stores 8 of its own.
"""

import tempfile

import openai
import pytest

from sluice_cluster import Serve, wait_until
from test_kvstore_prefill import KvStore
from test_swa_replay_disagg import MODEL_DIR, MODEL_NAME, prompt

BLOCK_SIZE = 16
LAYER_BYTES_PER_TOKEN = 2 * 2 * 64 * 4  # K and V, 2 KV heads x 64 dims, float32
FULL_LAYER_BYTES_PER_TOKEN = 2 * LAYER_BYTES_PER_TOKEN  # 2 full-attention layers of 8

pytestmark = pytest.mark.skipif(not MODEL_DIR.is_dir(), reason=f"{MODEL_DIR} missing")


def complete(url, ids):
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", timeout=120, max_retries=0)
    r = client.completions.create(model=MODEL_NAME, prompt=ids, temperature=0, max_tokens=12,
                                  extra_body={"ignore_eos": True})
    return r.choices[0].text, r.usage.prompt_tokens_details.cached_tokens


def test_kvstore_holds_full_layers_only_and_load_replays():
    store = KvStore(tempfile.mkdtemp(prefix="sluice-kvstore-"))
    ids = prompt(120, salt=7)  # 7 full blocks (112 tokens) can come from the store
    try:
        a = Serve(model_dir=MODEL_DIR, args=("--kvstore", store.address))
        try:
            text_a, cached_a = complete(a.url, ids)
            assert cached_a == 0
            # 7 prompt blocks + the block the outputs fill (120 + 11 computed tokens: 8 blocks).
            expected = 8 * BLOCK_SIZE * FULL_LAYER_BYTES_PER_TOKEN
            wait_until(lambda: store.metric("sluice_kvstore_bytes", tier="dram") >= expected, 15,
                       "write-through")
            stored = store.metric("sluice_kvstore_bytes", tier="dram")
            print(f"\nkvstore bytes for 8 blocks: {stored:.0f} "
                  f"({stored / (8 * BLOCK_SIZE):.0f} B/token)")
            assert stored == expected
        finally:
            a.stop()
        b = Serve(model_dir=MODEL_DIR, args=("--kvstore", store.address))
        try:
            text_b, cached_b = complete(b.url, ids)
        finally:
            b.stop()
        assert cached_b == 7 * BLOCK_SIZE
        assert text_b == text_a

        c = Serve(model_dir=MODEL_DIR, args=("--kvstore", store.address,
                                             "--swa-replay-tokens", "0"))
        try:
            text_c, cached_c = complete(c.url, ids)
            # C finds none of A's blocks (another layout id) and stores 8 blocks of its own.
            wait_until(lambda: store.metric("sluice_kvstore_blocks_stored_total") >= 16, 15,
                       "write-through of every layer")
            assert store.metric("sluice_kvstore_blocks_stored_total") == 16
        finally:
            c.stop()
        assert cached_c == 0  # the full-attention-only blocks are another layout
        assert text_c == text_a
    finally:
        store.proc.stop()
