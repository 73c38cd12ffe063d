"""Batch invariance through the HTTP API, `--batch-invariant` on the CPU backend (issue 28).

On sluice-mini-moe, llama-tiny and qwen3-hybrid-tiny a seeded sampled completion with 20 top
logprobs is first run alone on a `sluice serve` (whole-prompt prefill, no prefix cache). The same
request must then give bitwise-equal logprobs (JSON numbers carry a float32 exactly; tokens come
back as ids) and the same text
  - inside batches of 1, 16 and 64 concurrent random other requests,
  - on a server with chunked prefill (token budget 5) and the prefix cache, cold and warm,
  - on a router + prefill + decode cluster (KV moved between processes), alone and in a batch.
The engine-level golden test (tests/golden/batch_invariance_test.cc) covers more chunk sizes,
partly warm caches and transfers; this one covers the serving paths end to end.

SLUICE_TEST_DEVICE=cuda runs the same checks on the CUDA backend (a GPU machine; every server
and worker gets `--device cuda --gpu-memory-utilization 0.25`, so a prefill and a decode worker
share one GPU): the Llama runner (llama-tiny, qwen3-hybrid-tiny) and the DeepSeek runner
(sluice-mini-moe). The cluster case then needs the CUDA-aware UCX (scripts/install_deps.sh).
"""

import concurrent.futures
import os
import random

import openai
import pytest

from sluice_cluster import REPO, Cluster, Serve

SHARED = REPO.parent / "shared"
MODELS = {
    "sluice-mini-moe": REPO / "models" / "sluice-mini-moe",
    "llama-tiny": SHARED / "fixtures" / "llama-tiny",
    "qwen3-hybrid-tiny": SHARED / "fixtures" / "qwen3-hybrid-tiny",
}
DEVICE = os.environ.get("SLUICE_TEST_DEVICE", "cpu")
INVARIANT = ["--batch-invariant"] + (
    [] if DEVICE == "cpu" else ["--device", DEVICE, "--gpu-memory-utilization", "0.25"])
TARGET_PROMPT = ("The old lighthouse keeper climbed the stairs every evening, counting each step "
                 "and listening to the waves below. One night he")
TIMEOUT_S = 300


def target(client, name):
    """The request under test: seeded sampling, 20 top logprobs, tokens as ids."""
    r = client.completions.create(
        model=name, prompt=TARGET_PROMPT, max_tokens=10, temperature=0.8, top_p=0.95, seed=1234,
        logprobs=20, extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True})
    lp = r.choices[0].logprobs
    return {"text": r.choices[0].text, "tokens": lp.tokens, "logprobs": lp.token_logprobs,
            "top": lp.top_logprobs, "seed": r.model_extra["seed"]}


def other(client, name, i, rng):
    words = ["river", "stone", "quiet", "seven", "lamp", "north", "bread", "glass", "wind"]
    prompt = " ".join(rng.choice(words) for _ in range(rng.randint(1, 30)))
    kwargs = dict(model=name, prompt=prompt, max_tokens=rng.randint(1, 12),
                  extra_body={"ignore_eos": True})
    if i % 3 == 0:
        kwargs["temperature"] = 0
    elif i % 3 == 1:
        kwargs.update(temperature=1.0, seed=1234, logprobs=rng.randint(0, 5))
    else:
        kwargs.update(temperature=0.7, extra_body={"ignore_eos": True, "top_k": 20})
    client.completions.create(**kwargs)


def in_batch(client, name, count, seed):
    """The target among `count` concurrent other requests, launched in random order."""
    rng = random.Random(seed)
    position = rng.randint(0, count)
    with concurrent.futures.ThreadPoolExecutor(max_workers=count + 1) as pool:
        futures = [pool.submit(other, client, name, i, random.Random(seed * 100 + i))
                   for i in range(position)]
        mine = pool.submit(target, client, name)
        futures += [pool.submit(other, client, name, i, random.Random(seed * 100 + i))
                    for i in range(position, count)]
        for f in futures:
            f.result()
        return mine.result()


def make_client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="x", timeout=TIMEOUT_S, max_retries=0)


@pytest.fixture(scope="module", params=list(MODELS))
def model(request):
    return request.param, MODELS[request.param]


@pytest.fixture(scope="module")
def plain(model):
    """Reference server: whole prompts in one step, no prefix cache."""
    name, path = model
    s = Serve(path, args=[*INVARIANT, "--no-prefix-caching", "--max-num-batched-tokens", "512"])
    yield make_client(s.url)
    s.stop()


@pytest.fixture(scope="module")
def alone(model, plain):
    name, _ = model
    ref = target(plain, name)
    assert len(ref["tokens"]) == 10
    assert all(len(top) in (20, 21) for top in ref["top"])  # + the sampled token
    return ref


def test_same_bits_inside_batches(model, plain, alone):
    name, _ = model
    for count in (1, 16, 64):
        assert in_batch(plain, name, count, seed=count) == alone, f"{count} others"


def test_same_bits_with_chunked_prefill_and_prefix_cache(model, alone):
    name, path = model
    s = Serve(path, args=[*INVARIANT, "--max-num-batched-tokens", "5", "--block-size", "4"])
    try:
        client = make_client(s.url)
        assert target(client, name) == alone  # cold cache, 5-token chunks
        assert target(client, name) == alone  # warm: the prompt's blocks come from the cache
        assert in_batch(client, name, 8, seed=5) == alone
    finally:
        s.stop()


def test_same_bits_on_a_router_prefill_decode_cluster(model, alone):
    name, path = model
    c = Cluster(num_prefill=1, num_decode=1, worker_args=INVARIANT, model_dir=path)
    try:
        client = make_client(c.url)
        assert target(client, name) == alone
        assert in_batch(client, name, 16, seed=9) == alone
        # The prompts' KV really moved, every layer of it: no approximate SWA replay.
        assert c.worker_metric("decode-0", "sluice_kv_transfers_total") > 0
        assert c.worker_metric("decode-0", "sluice_decode_swa_replayed_tokens_total") == 0
    finally:
        c.stop()
