"""Prefix caching through the official `openai` SDK: usage.prompt_tokens_details.cached_tokens on
repeated prompts and chat turns, identical greedy text with the cache on and off, cache_salt
isolation, and `--no-prefix-caching`.

Every prompt starts with a fresh nonce so that blocks cached by other tests of the session server
never match (the session server keeps its cache across tests). Block size is the engine default
(16 tokens): a repeat serves every full block of the prompt except the one holding its last token.
"""

import re
import time
import urllib.request
import uuid

import openai
import pytest

from conftest import ServerProcess

BLOCK_SIZE = 16


def nonce() -> str:
    return uuid.uuid4().hex[:12]


def long_question(tag: str) -> str:
    return (f"[{tag}] In the beginning God created the heaven and the earth. And the earth was "
            "without form, and void; and darkness was upon the face of the deep. And the Spirit "
            "of God moved upon the face of the waters. Tell me what happened next.")


@pytest.fixture(scope="module")
def uncached_client():
    proc = ServerProcess(extra_args=["--no-prefix-caching"])
    yield openai.OpenAI(base_url=proc.url + "/v1", api_key="sk-unused", max_retries=0,
                        timeout=300)
    assert proc.stop() == 0, proc.logs()


def chat(client, model, messages, **kwargs):
    return client.chat.completions.create(model=model, messages=messages, max_tokens=12,
                                          temperature=0, **kwargs)


def test_repeated_prompt_is_served_from_the_cache(client, model):
    messages = [{"role": "user", "content": long_question(nonce())}]
    first = chat(client, model, messages)
    second = chat(client, model, messages)
    prompt_tokens = first.usage.prompt_tokens
    assert prompt_tokens > 3 * BLOCK_SIZE
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached % BLOCK_SIZE == 0
    assert cached == (prompt_tokens - 1) // BLOCK_SIZE * BLOCK_SIZE
    assert second.choices[0].message.content == first.choices[0].message.content


def test_multi_turn_matches_server_without_cache(client, uncached_client, model):
    messages = [{"role": "user", "content": long_question(nonce())}]
    turn1 = chat(client, model, messages)
    ref1 = chat(uncached_client, model, messages)
    assert turn1.choices[0].message.content == ref1.choices[0].message.content
    messages += [{"role": "assistant", "content": turn1.choices[0].message.content},
                 {"role": "user", "content": "And then what did God say about the light?"}]
    turn2 = chat(client, model, messages)
    ref2 = chat(uncached_client, model, messages)
    assert turn2.choices[0].message.content == ref2.choices[0].message.content
    assert turn2.usage.prompt_tokens == ref2.usage.prompt_tokens
    # Turn 2 repeats turn 1's prompt: at least its full blocks come from the cache.
    assert turn2.usage.prompt_tokens_details.cached_tokens >= \
        turn1.usage.prompt_tokens // BLOCK_SIZE * BLOCK_SIZE
    assert ref2.usage.prompt_tokens_details.cached_tokens == 0


def test_cached_tokens_in_streamed_usage(client, model):
    messages = [{"role": "user", "content": long_question(nonce())}]
    chat(client, model, messages)
    chunks = list(chat(client, model, messages, stream=True,
                       stream_options={"include_usage": True}))
    usage = chunks[-1].usage
    assert usage is not None
    assert usage.prompt_tokens_details.cached_tokens == \
        (usage.prompt_tokens - 1) // BLOCK_SIZE * BLOCK_SIZE


def test_cache_salt_isolates_tenants(client, model):
    messages = [{"role": "user", "content": long_question(nonce())}]
    a1 = chat(client, model, messages, extra_body={"cache_salt": "tenant-a"})
    b1 = chat(client, model, messages, extra_body={"cache_salt": "tenant-b"})
    shared = chat(client, model, messages)
    a2 = chat(client, model, messages, extra_body={"cache_salt": "tenant-a"})
    assert a1.usage.prompt_tokens_details.cached_tokens == 0
    assert b1.usage.prompt_tokens_details.cached_tokens == 0
    assert shared.usage.prompt_tokens_details.cached_tokens == 0
    assert a2.usage.prompt_tokens_details.cached_tokens > 0
    assert a2.choices[0].message.content == a1.choices[0].message.content
    with pytest.raises(openai.BadRequestError) as err:
        chat(client, model, messages, extra_body={"cache_salt": ""})
    assert "cache_salt" in str(err.value)


def test_completions_report_cached_tokens(client, model):
    prompt = long_question(nonce())
    first = client.completions.create(model=model, prompt=prompt, max_tokens=8, temperature=0)
    second = client.completions.create(model=model, prompt=prompt, max_tokens=8, temperature=0)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert second.usage.prompt_tokens_details.cached_tokens > 0
    assert second.choices[0].text == first.choices[0].text


def test_no_prefix_caching_reports_zero(uncached_client, model):
    messages = [{"role": "user", "content": long_question(nonce())}]
    chat(uncached_client, model, messages)
    again = chat(uncached_client, model, messages)
    assert again.usage.prompt_tokens_details.cached_tokens == 0


def metric(url: str, name: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
        text = r.read().decode()
    match = re.search(rf"^{name} (\S+)$", text, re.M)
    assert match, f"{name} missing from /metrics"
    return float(match.group(1))


def test_metrics_count_prefix_cache_hits(client, model, base_url):
    before_hits = metric(base_url, "sluice_prefix_cache_hits_total")
    before_cached = metric(base_url, "sluice_prompt_tokens_cached_total")
    messages = [{"role": "user", "content": long_question(nonce())}]
    chat(client, model, messages)
    again = chat(client, model, messages)
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert cached > 0
    # The engine publishes its counters after each step: wait (bounded) for that step.
    deadline = time.monotonic() + 10
    while (metric(base_url, "sluice_prompt_tokens_cached_total") - before_cached != cached
           and time.monotonic() < deadline):
        time.sleep(0.05)
    assert metric(base_url, "sluice_prompt_tokens_cached_total") - before_cached == cached
    assert metric(base_url, "sluice_prefix_cache_hits_total") - before_hits == cached
    queries = metric(base_url, "sluice_prefix_cache_queries_total")
    assert queries >= metric(base_url, "sluice_prefix_cache_hits_total")
    assert metric(base_url, "sluice_kv_cache_cached_blocks") > 0
