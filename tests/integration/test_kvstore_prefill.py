"""Prefill workers share prompt KV through the kvstore (`sluice prefill --kvstore host:port`).

kvstore + router + 1 decode worker + prefill worker A; A prefills prompts X, Y and Z and writes
their full blocks through to the kvstore. Then A drains and a fresh prefill worker B takes over
(its local prefix cache is empty, so anything it does not compute came from the kvstore).
The store runs its UCX data path: block bytes move by RMA between the workers' registered
buffers and the store's DRAM, never in gRPC messages (sluice_kvstore_bytes_total{path}).

  * X on B: only the uncached tail is computed (B's sluice_prompt_tokens_computed_total, its
    cached_total{source="kvstore"}, usage cached_tokens), same greedy text as on A;
  * kill -9 + restart the kvstore (same SSD dir), Y on B: still served, from the SSD tier;
  * one of Z's block files flipped on disk, Z on B: the store detects it, the loaded run stops
    there, the rest is recomputed, the text is still A's;
  * the kvstore stopped: a new prompt still succeeds, computed in full.
"""

import tempfile
import uuid

import openai
import pytest

from sluice_cluster import (MODEL_DIR, MODEL_NAME, Cluster, KvStore, Proc, free_port, sluice_bin,
                            sum_samples, wait_until)

BLOCK_SIZE = 16


@pytest.fixture(scope="module")
def env():
    c = None
    store = None
    try:
        # Workers take the store's address at start: it runs first, in its own temp dir.
        store = KvStore(tempfile.mkdtemp(prefix="sluice-kvstore-"), ucx=True)
        c = Cluster(num_prefill=1, num_decode=1,
                    role_args={"prefill": ["--kvstore", store.address]})
        client = openai.OpenAI(base_url=c.url + "/v1", api_key="x", timeout=120, max_retries=0)
        yield c, store, client
    finally:
        if c is not None:
            c.stop()
        if store is not None:
            store.proc.stop()


def prompt_text(tag):
    # ~300 tokens, distinct from the first block on (the tag comes first).
    words = " ".join(f"{tag}{i}" for i in range(12))
    return (f"{words}. In the beginning God created the heaven and the earth. And the earth was "
            "without form, and void; and darkness was upon the face of the deep. And the Spirit "
            "of God moved upon the face of the waters. And God said, Let there be light: and "
            "there was light. And God saw the light, that it was good: and God divided the light "
            "from the darkness. And God called the light Day, and the darkness he called Night. "
            "And the evening and the morning were the first day. And God said, Let there be a "
            "firmament in the midst of the waters, and let it divide the waters from the waters. "
            "And God made the firmament, and divided the waters which were under the firmament "
            "from the waters which were above the firmament: and it was so. And God called the "
            "firmament Heaven. And the evening and the morning were the second day. And God said, "
            "Let the waters under the heaven be gathered together unto one place, and let the dry "
            "land appear: and it was so. What came next?")


def ask(client, content):
    return client.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": content}], temperature=0,
        max_tokens=8)


def worker_counts(c, name):
    text = c.worker_metrics_text(name)
    kvstore = sum_samples("\n".join(l for l in text.splitlines() if 'source="kvstore"' in l),
                          "sluice_prompt_tokens_cached_total")
    return (sum_samples(text, "sluice_prompt_tokens_computed_total"), kvstore)


def saved_blocks(c, name):
    text = c.worker_metrics_text(name)
    return sum_samples("\n".join(l for l in text.splitlines() if 'op="saved"' in l),
                       "sluice_kvstore_blocks_total")


def kvstore_bytes(c, name, path):
    text = c.worker_metrics_text(name)
    return sum_samples("\n".join(l for l in text.splitlines() if f'path="{path}"' in l),
                       "sluice_kvstore_bytes_total")


def add_prefill(c, name, kvstore_address):
    http_port = free_port()
    c.metrics_urls[name] = f"http://127.0.0.1:{http_port}/metrics"
    c.workers[name] = Proc(name, [
        sluice_bin(), "prefill", "--model", str(MODEL_DIR), "--listen", f"127.0.0.1:{free_port()}",
        "--router", f"127.0.0.1:{c.grpc_port}", "--http-port", str(http_port),
        "--kvstore", kvstore_address], c.dir)


def test_prefill_served_from_kvstore_across_workers_restart_and_corruption(env):
    c, store, client = env
    a = "prefill-0"
    run = uuid.uuid4().hex[:6]
    x, y, z = (prompt_text(f"{t}{run}") for t in "xyz")

    # --- Worker A computes X and Y, then Z; every full prompt block is written through.
    on_a = {}
    full_blocks = 0
    files_before_z = None
    for name, text in (("x", x), ("y", y), ("z", z)):
        if name == "z":
            files_before_z = store.block_files()
        r = ask(client, text)
        assert r.usage.prompt_tokens_details.cached_tokens == 0
        on_a[name] = r
        full_blocks += r.usage.prompt_tokens // BLOCK_SIZE
        try:
            wait_until(lambda: saved_blocks(c, a) >= full_blocks, 20, f"write-through of {name}")
        except TimeoutError:
            raise AssertionError(f"{full_blocks} blocks not written through:\n"
                                 f"{c.worker_metrics_text(a)}\n{c.workers[a].tail()}")
    assert saved_blocks(c, a) == full_blocks
    # Written through by RMA, a whole number of blocks, nothing inline.
    rma_a = kvstore_bytes(c, a, "rma")
    assert rma_a > 0 and rma_a % full_blocks == 0, rma_a
    assert kvstore_bytes(c, a, "inline") == 0
    assert 250 <= on_a["x"].usage.prompt_tokens <= 450, on_a["x"].usage
    wait_until(lambda: store.metric("sluice_kvstore_blocks", "ssd") >= full_blocks, 20,
               "blocks on the kvstore's SSD tier")
    z_files = sorted(store.block_files() - files_before_z)
    assert len(z_files) == on_a["z"].usage.prompt_tokens // BLOCK_SIZE

    # --- A drains; B (empty local cache) takes over.
    b = "prefill-1"
    add_prefill(c, b, store.address)
    c.workers.pop(a).stop()
    c.wait_registered(1, 1)

    def served_on_b(name, text):
        computed0, kvstore0 = worker_counts(c, b)
        r = ask(client, text)
        computed1, kvstore1 = worker_counts(c, b)
        assert r.choices[0].message.content == on_a[name].choices[0].message.content, name
        return r, computed1 - computed0, kvstore1 - kvstore0

    # X: everything but the tail comes from the kvstore.
    r, computed, from_store = served_on_b("x", x)
    n = r.usage.prompt_tokens
    cacheable = (n - 1) // BLOCK_SIZE * BLOCK_SIZE
    assert (computed, from_store) == (n - cacheable, cacheable)
    assert r.usage.prompt_tokens_details.cached_tokens == cacheable
    # Loaded by RMA: its blocks are as large as A's.
    assert kvstore_bytes(c, b, "rma") >= cacheable // BLOCK_SIZE * (rma_a // full_blocks)
    assert kvstore_bytes(c, b, "inline") == 0

    # kill -9 + restart the kvstore: Y comes from its SSD tier.
    store.restart_after_kill9()
    assert store.metric("sluice_kvstore_blocks", "dram") == 0
    hits_ssd0 = store.metric("sluice_kvstore_hits_total", "ssd")
    r, computed, from_store = served_on_b("y", y)
    n = r.usage.prompt_tokens
    cacheable = (n - 1) // BLOCK_SIZE * BLOCK_SIZE
    assert (computed, from_store) == (n - cacheable, cacheable)
    assert r.usage.prompt_tokens_details.cached_tokens == cacheable
    assert store.metric("sluice_kvstore_hits_total", "ssd") - hits_ssd0 == cacheable // BLOCK_SIZE
    assert kvstore_bytes(c, b, "inline") == 0  # the restarted store is reached by UCX too

    # One of Z's block files corrupted on disk: detected, that block and the rest recomputed.
    # Files are named by block hash, so their order says nothing about prompt position, and the
    # prompt's last full block is never loaded (one token is always computed): corrupt two files,
    # so at least one loadable block is corrupt whichever position each holds.
    for victim in z_files[:2]:
        data = bytearray(victim.read_bytes())
        data[64 + 100] ^= 0x40  # payload byte (the header is 64 bytes)
        victim.write_bytes(bytes(data))
    r, computed, from_store = served_on_b("z", z)
    n = r.usage.prompt_tokens
    assert from_store % BLOCK_SIZE == 0 and from_store < (n - 1) // BLOCK_SIZE * BLOCK_SIZE
    assert computed == n - from_store
    assert r.usage.prompt_tokens_details.cached_tokens == from_store
    assert 1 <= store.metric("sluice_kvstore_corrupt_blocks_total") <= 2

    # The kvstore gone: a new prompt still succeeds, computed in full; A's text for it unknown,
    # so its greedy text is checked against a second ask on the same worker (local cache).
    store.proc.stop()
    w = prompt_text(f"w{run}")
    computed0, kvstore0 = worker_counts(c, b)
    r = ask(client, w)
    computed1, kvstore1 = worker_counts(c, b)
    assert (computed1 - computed0, kvstore1 - kvstore0) == (r.usage.prompt_tokens, 0)
    assert r.usage.prompt_tokens_details.cached_tokens == 0
    assert c.worker_metric(b, "sluice_kvstore_load_errors_total") >= 1
    again = ask(client, w)
    assert again.choices[0].message.content == r.choices[0].message.content
