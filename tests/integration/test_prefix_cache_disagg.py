"""Prefix caching through the disaggregated path: router + 1 prefill + 1 decode worker.

A repeated prompt is served from the prefill worker's prefix cache (usage cached_tokens, the
same greedy text as the first time), and cache_salt travels router -> prefill so tenants with
different salts never share cached KV. With one prefill worker every request lands on it.
"""

import uuid

import openai
import pytest

from sluice_cluster import MODEL_NAME, Cluster

BLOCK_SIZE = 16


@pytest.fixture(scope="module")
def client():
    c = Cluster(num_prefill=1, num_decode=1)
    yield openai.OpenAI(base_url=c.url + "/v1", api_key="x", timeout=240, max_retries=0)
    c.stop()


def ask(client, content, **kwargs):
    return client.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": content}], temperature=0,
        max_tokens=12, **kwargs)


def question() -> str:
    return (f"[{uuid.uuid4().hex[:12]}] In the beginning God created the heaven and the earth. "
            "And the earth was without form, and void; and darkness was upon the face of the "
            "deep. What came next?")


def test_repeated_prompt_uses_the_prefill_workers_cache(client):
    q = question()
    first = ask(client, q)
    second = ask(client, q)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert second.usage.prompt_tokens_details.cached_tokens == \
        (second.usage.prompt_tokens - 1) // BLOCK_SIZE * BLOCK_SIZE
    assert second.choices[0].message.content == first.choices[0].message.content


def test_cache_salt_reaches_the_workers(client):
    q = question()
    a1 = ask(client, q, extra_body={"cache_salt": "tenant-a"})
    b1 = ask(client, q, extra_body={"cache_salt": "tenant-b"})
    a2 = ask(client, q, extra_body={"cache_salt": "tenant-a"})
    assert a1.usage.prompt_tokens_details.cached_tokens == 0
    assert b1.usage.prompt_tokens_details.cached_tokens == 0
    assert a2.usage.prompt_tokens_details.cached_tokens > 0
    assert a2.choices[0].message.content == a1.choices[0].message.content
