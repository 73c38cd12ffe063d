"""/v1/responses (stateless) through the official SDK's responses.create and responses.stream:
the text equals the chat endpoint's for the same greedy request, events come in the order the
SDK's stream helper expects, usage is right, and stateful fields are refused by name.
Function calling and text.format: test_responses_tools.py."""

import openai
import pytest

QUESTION = "Who made the heaven and the earth?"
SYSTEM = "You are a concordance of the King James Bible."


def chat(client, model, messages, max_tokens):
    return client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens,
                                          temperature=0)


def test_create_with_string_input_equals_chat(client, model):
    want = chat(client, model, [{"role": "user", "content": QUESTION}], 12)
    r = client.responses.create(model=model, input=QUESTION, max_output_tokens=12,
                                temperature=0)
    assert r.id.startswith("resp_") and r.object == "response"
    assert r.output_text == want.choices[0].message.content
    assert r.output[0].type == "message" and r.output[0].role == "assistant"
    assert r.output[0].content[0].type == "output_text"
    assert r.usage.input_tokens == want.usage.prompt_tokens
    assert r.usage.output_tokens == want.usage.completion_tokens
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.max_output_tokens == 12 and r.temperature == 0
    if want.choices[0].finish_reason == "length":
        assert r.status == "incomplete"
        assert r.incomplete_details.reason == "max_output_tokens"
    else:
        assert r.status == "completed"


def test_instructions_and_message_input_equal_chat(client, model):
    messages = [{"role": "user", "content": "Ge1:1"},
                {"role": "assistant", "content": "In the beginning"},
                {"role": "user", "content": QUESTION}]
    want = chat(client, model, [{"role": "system", "content": SYSTEM}] + messages, 10)
    r = client.responses.create(
        model=model, instructions=SYSTEM, max_output_tokens=10, temperature=0,
        input=[messages[0],
               {"type": "message", "role": "assistant",
                "content": [{"type": "output_text", "text": "In the beginning"}]},
               {"role": "user", "content": [{"type": "input_text", "text": QUESTION}]}])
    assert r.output_text == want.choices[0].message.content
    assert r.instructions == SYSTEM
    assert r.usage.input_tokens == want.usage.prompt_tokens


def test_stream_events_as_the_sdk_parses_them(client, model):
    want = chat(client, model, [{"role": "user", "content": QUESTION}], 12)
    with client.responses.stream(model=model, input=QUESTION, max_output_tokens=12,
                                 temperature=0) as stream:
        events = list(stream)
        final = stream.get_final_response()
    types = [e.type for e in events]
    assert types[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert types[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.completed"]
    assert set(types[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == want.choices[0].message.content == final.output_text
    done = [e for e in events if e.type == "response.output_text.done"][0]
    assert done.text == text
    assert final.usage.output_tokens == want.usage.completion_tokens
    item_ids = {e.item_id for e in events if hasattr(e, "item_id")}
    assert item_ids == {final.output[0].id}


def test_create_stream_true(client, model):
    want = client.responses.create(model=model, input=QUESTION, max_output_tokens=8,
                                   temperature=0)
    events = list(client.responses.create(model=model, input=QUESTION, max_output_tokens=8,
                                          temperature=0, stream=True))
    assert events[0].type == "response.created" and events[0].response.status == "in_progress"
    assert events[-1].type == "response.completed"
    assert events[-1].response.output_text == want.output_text


def test_sampling_fields(client, model):
    want = chat(client, model, [{"role": "user", "content": QUESTION}], 8)
    r = client.responses.create(model=model, input=QUESTION, max_output_tokens=8,
                                temperature=1.0, extra_body={"top_k": 1, "seed": 3})
    assert r.output_text == want.choices[0].message.content
    forced = client.responses.create(model=model, input=QUESTION, max_output_tokens=3,
                                     temperature=0,
                                     extra_body={"logit_bias": {"300": 100},
                                                 "ignore_eos": True})
    assert forced.usage.output_tokens == 3


# Every honoured sampling field of the responses table takes the chat path: the same value
# gives chat's text (seeded sampling at temperature 1, so each field can change the draw).
@pytest.mark.parametrize("field,value", [
    ("top_p", 0.5), ("min_p", 0.2), ("presence_penalty", 1.5), ("frequency_penalty", 1.5),
    ("repetition_penalty", 1.5), ("allowed_token_ids", list(range(300, 340))),
    ("bad_words", ["the"]), ("min_tokens", 6), ("cache_salt", "tenant-a"),
    ("skip_special_tokens", False)])
def test_honoured_field_equals_chat(client, model, field, value):
    extra = {"seed": 11, field: value}
    want = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": QUESTION}], max_tokens=12,
        temperature=1.0, extra_body=extra)
    got = client.responses.create(model=model, input=QUESTION, max_output_tokens=12,
                                  temperature=1.0, extra_body=extra)
    assert got.output_text == want.choices[0].message.content
    assert got.usage.output_tokens == want.usage.completion_tokens
    plain = client.responses.create(model=model, input=QUESTION, max_output_tokens=12,
                                    temperature=1.0, extra_body={"seed": 11})
    # cache_salt and skip_special_tokens change no sampled token, and this output runs past
    # min_tokens anyway (its effect: test_sampling_effects.py).
    if field not in ("cache_salt", "skip_special_tokens", "min_tokens"):
        assert plain.output_text != got.output_text, f"{field} had no effect"


@pytest.mark.parametrize("field,value", [
    ("store", True), ("previous_response_id", "resp_123"), ("background", True),
    ("reasoning", {"effort": "low"}), ("include", ["message.output_text.logprobs"]),
    ("max_tool_calls", 2), ("frobnicate", 1)])
def test_refused_fields(client, model, field, value):
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=model, input=QUESTION, max_output_tokens=2,
                                extra_body={field: value})
    assert e.value.body["param"] == field
    assert client.responses.create(model=model, input=QUESTION,
                                   max_output_tokens=2).usage.output_tokens >= 1


def test_accepted_metadata(client, model):
    r = client.responses.create(model=model, input=QUESTION, max_output_tokens=2, store=False,
                                metadata={"k": "v"}, user="u1", text={"format": {"type": "text"}},
                                truncation="disabled")
    assert r.metadata == {"k": "v"}
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=model, input=[], max_output_tokens=2)
    assert e.value.body["param"] == "input"
