"""KV-aware routing end to end: router (--routing-policy kv) + 2 prefill + 1 decode workers.

The second turn of a conversation goes to the prefill worker that prefilled the first turn (it
holds the shared prefix: system prompt + first user message) and reports cached_tokens > 0. A
load-only choice would send it to the other prefill worker (picked less often), where nothing is
cached. The router learns the first turn's blocks both from its own routing record and from the
worker's KV events (polled every 50 ms).
"""

import json
import shutil
import time

import openai
import pytest

from sluice_cluster import MODEL_NAME, Cluster, http_get, promtool_problems

SYSTEM = ("You are a careful assistant for a river harbor. Answer briefly, cite the harbor "
          "rules by number, and never invent rule numbers. Rules: 1. lanterns at dusk; "
          "2. copper moorings only; 3. no anchors in the meadow channel; 4. report every "
          "falcon sighting to the harbor master before noon.")


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(num_prefill=2, num_decode=1, router_args=["--routing-policy", "kv"])
    yield c
    c.stop()


def picks(cluster):
    """Prefill picks per prefill worker id, from the router's /v1/workers."""
    workers = json.loads(http_get(cluster.url + "/v1/workers")[1])["data"]
    return {w["id"]: w["picked"] for w in workers if w["role"] == "prefill"}


def test_second_turn_goes_to_the_worker_holding_its_prefix(cluster):
    client = openai.OpenAI(base_url=cluster.url + "/v1", api_key="x", timeout=60, max_retries=0)
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": "May I anchor in the meadow channel?"}]
    first = client.chat.completions.create(model=MODEL_NAME, messages=messages, temperature=0,
                                           max_tokens=8)
    assert first.usage.prompt_tokens > 32
    after_first = picks(cluster)
    assert sorted(after_first.values()) == [0, 1]
    holder = next(w for w, n in after_first.items() if n == 1)
    time.sleep(0.3)  # a few event polls: the worker's stored event confirms the routing record
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "And what about falcons?"}]
    second = client.chat.completions.create(model=MODEL_NAME, messages=messages, temperature=0,
                                            max_tokens=8)
    assert picks(cluster)[holder] == 2
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached > 0
    # At least the first turn's full blocks (block size 16) minus the last, partial one.
    assert cached >= (first.usage.prompt_tokens // 16 - 1) * 16
    assert cached < second.usage.prompt_tokens
    # The router's own view: the second pick had overlap, and the index predicted what the
    # worker then reported cached (both count whole blocks, so the prediction cannot exceed it).
    text = http_get(cluster.url + "/metrics")[1]
    assert 'sluice_router_kv_picks_total{overlap="true"} 1' in text, text
    predicted = cluster.metric("sluice_router_kv_predicted_cached_tokens_total")
    assert 0 < predicted <= second.usage.prompt_tokens
    if shutil.which("promtool"):  # the router's whole exposition stays valid
        assert promtool_problems(text) == [], text
