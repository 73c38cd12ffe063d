"""The OpenAI API through the official `openai` SDK: shapes, streaming, n, logprobs, stop
strings, usage, seeds and errors."""

import math

import openai
import pytest

CHAT = [{"role": "user", "content": "Tell me a story about a fox."}]


def test_models_list(client, model):
    models = client.models.list()
    assert [m.id for m in models.data] == [model]
    assert client.models.retrieve(model).id == model


def test_chat_completion(client, model):
    r = client.chat.completions.create(model=model, messages=CHAT, max_tokens=12, temperature=0)
    assert r.id.startswith("chatcmpl-")
    assert r.object == "chat.completion"
    assert r.model == model
    assert len(r.choices) == 1
    choice = r.choices[0]
    assert choice.index == 0
    assert choice.message.role == "assistant"
    assert isinstance(choice.message.content, str) and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 5
    assert 1 <= r.usage.completion_tokens <= 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.usage.prompt_tokens_details.cached_tokens >= 0


def test_chat_stream_matches_non_stream(client, model):
    full = client.chat.completions.create(model=model, messages=CHAT, max_tokens=16,
                                          temperature=0)
    chunks = list(client.chat.completions.create(model=model, messages=CHAT, max_tokens=16,
                                                 temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].choices[0].delta.content == ""
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == full.choices[0].finish_reason
    assert all(f is None for f in finishes[:-1])
    assert text == full.choices[0].message.content
    assert all(c.usage is None for c in chunks)


def test_completion_and_stream(client, model):
    full = client.completions.create(model=model, prompt="Once upon a time", max_tokens=16,
                                     temperature=0)
    assert full.id.startswith("cmpl-")
    assert full.object == "text_completion"
    assert full.choices[0].finish_reason in ("stop", "length")
    assert full.usage.completion_tokens <= 16
    chunks = list(client.completions.create(model=model, prompt="Once upon a time",
                                            max_tokens=16, temperature=0, stream=True))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == full.choices[0].text
    assert chunks[-1].choices[0].finish_reason == full.choices[0].finish_reason


def test_n_choices(client, model):
    r = client.chat.completions.create(model=model, messages=CHAT, max_tokens=8, n=2,
                                       temperature=1.0, seed=3)
    assert sorted(c.index for c in r.choices) == [0, 1]
    assert r.usage.completion_tokens >= 2  # both choices counted
    stream = list(client.completions.create(model=model, prompt="Hello", max_tokens=6, n=2,
                                            temperature=1.0, seed=3, stream=True))
    seen = {c.choices[0].index for c in stream if c.choices}
    assert seen == {0, 1}
    done = [c.choices[0] for c in stream if c.choices and c.choices[0].finish_reason]
    assert sorted(c.index for c in done) == [0, 1]


def test_chat_logprobs(client, model):
    r = client.chat.completions.create(model=model, messages=CHAT, max_tokens=6, temperature=0,
                                       logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for entry in content:
        assert entry.logprob <= 0.0
        assert len(entry.top_logprobs) == 3
        # Greedy: the chosen token is the most likely one.
        assert math.isclose(entry.logprob, entry.top_logprobs[0].logprob, abs_tol=1e-4)
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob
        assert isinstance(entry.bytes, list)


def test_completion_logprobs(client, model):
    r = client.completions.create(model=model, prompt="The sky is", max_tokens=5, temperature=0,
                                  logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    assert len(lp.text_offset) == 5
    assert lp.text_offset == sorted(lp.text_offset)
    # Up to logprobs + 1 entries: the top 2 and the sampled token (greedy: among the top 2).
    assert all(len(t) == 2 for t in lp.top_logprobs)
    for token, top in zip(lp.tokens, lp.top_logprobs):
        assert token in top
        assert top[token] == max(top.values())
    assert "".join(lp.tokens) == r.choices[0].text


@pytest.mark.parametrize("stream", [False, True])
def test_stop_string(client, model, stream):
    base = client.completions.create(model=model, prompt="Once upon a time", max_tokens=24,
                                     temperature=0).choices[0].text
    assert len(base) > 8, base
    stop = base[4:7]
    expected = base[: base.index(stop)]
    if stream:
        chunks = list(client.completions.create(model=model, prompt="Once upon a time",
                                                max_tokens=24, temperature=0, stop=[stop],
                                                stream=True))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        finish = chunks[-1].choices[0].finish_reason
    else:
        r = client.completions.create(model=model, prompt="Once upon a time", max_tokens=24,
                                      temperature=0, stop=[stop])
        text, finish = r.choices[0].text, r.choices[0].finish_reason
    assert stop not in text
    assert text == expected
    assert finish == "stop"


def test_stream_include_usage(client, model):
    chunks = list(client.chat.completions.create(model=model, messages=CHAT, max_tokens=5,
                                                 temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    last = chunks[-1]
    assert last.choices == []
    assert 1 <= last.usage.completion_tokens <= 5
    assert last.usage.total_tokens == last.usage.prompt_tokens + last.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])
    text_chunks = [c for c in chunks[:-1] if c.choices and c.choices[0].delta.content]
    assert len(text_chunks) >= 1


def test_seed_determinism(client, model):
    kwargs = dict(model=model, prompt="In a small village", max_tokens=20, temperature=1.0,
                  top_p=0.95, seed=1234)
    a = client.completions.create(**kwargs).choices[0].text
    b = client.completions.create(**kwargs).choices[0].text
    assert a == b


def test_invalid_parameters_are_400_naming_the_param(client, model):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, messages=CHAT, top_p=2.0)
    assert e.value.body["param"] == "top_p"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, messages=CHAT, n=0)
    assert e.value.body["param"] == "n"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model, prompt="x", max_tokens=100000)
    assert e.value.body["param"] == "prompt"
    assert "2048" in e.value.body["message"]


def test_unsupported_beam_search_is_400(client, model):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, messages=CHAT,
                                       extra_body={"use_beam_search": True})
    assert e.value.body["param"] == "use_beam_search"
    assert "beam search" in e.value.body["message"]


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4o", messages=CHAT)
    assert e.value.body["param"] == "model"
