"""Function calling and structured output on /v1/responses through the official SDK
(`client.responses.create` / `.stream` / `.parse`) against `sluice serve` (embedded model, whose
template writes Hermes-style <tool_call> blocks). They run through the chat code: the calls and
arguments equal chat's for the same greedy request; every function_call item has a call_id, a
name from `tools` and arguments that validate against its parameters (`jsonschema`); streamed
events build exactly the final output; text.format output parses and validates; what stays
unsupported is a 400 naming the Responses field."""

import json

import jsonschema
import openai
import pytest
from pydantic import BaseModel

QUESTION = "What is the weather in Oslo?"
WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 10}, "unit": {"enum": ["c", "f"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "unit"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET", "PST"]}},
        "required": ["zone"]}
TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather now",
          "parameters": WEATHER},
         {"type": "function", "name": "get_time", "parameters": TIME}]
CHAT_TOOLS = [{"type": "function", "function": {k: v for k, v in t.items() if k != "type"}}
              for t in TOOLS]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
MAX_TOKENS = 400


def check_call(item, names=("get_weather", "get_time")):
    assert item.type == "function_call" and item.status == "completed"
    assert item.call_id.startswith("call_") and len(item.call_id) == 29
    assert item.id.startswith("fc_") and item.id != item.call_id
    assert item.name in names
    jsonschema.validate(json.loads(item.arguments), SCHEMAS[item.name])


def test_required_calls_equal_chat(client, model):
    chat = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": QUESTION}], tools=CHAT_TOOLS,
        tool_choice="required", max_tokens=MAX_TOKENS, temperature=0)
    r = client.responses.create(model=model, input=QUESTION, tools=TOOLS, tool_choice="required",
                                max_output_tokens=MAX_TOKENS, temperature=0)
    assert r.status == "completed"
    assert [o.type for o in r.output] == ["function_call"] * len(r.output) and r.output
    for item in r.output:
        check_call(item)
    want = chat.choices[0].message.tool_calls
    assert [(o.name, o.arguments) for o in r.output] == \
        [(c.function.name, c.function.arguments) for c in want]
    assert r.usage.input_tokens == chat.usage.prompt_tokens
    assert r.usage.output_tokens == chat.usage.completion_tokens
    assert len({o.call_id for o in r.output}) == len(r.output)
    # The request's tool fields, echoed.
    assert [t.name for t in r.tools] == ["get_weather", "get_time"]
    assert r.tool_choice == "required" and r.parallel_tool_calls is True


def test_named_function_one_call_sampled(client, model):
    for seed in (3, 11):
        r = client.responses.create(
            model=model, input=QUESTION, tools=TOOLS, max_output_tokens=MAX_TOKENS,
            tool_choice={"type": "function", "name": "get_time"}, parallel_tool_calls=False,
            temperature=1.0, extra_body={"seed": seed})
        assert len(r.output) == 1
        check_call(r.output[0], names=("get_time",))
        assert r.tool_choice.type == "function" and r.tool_choice.name == "get_time"
        assert r.parallel_tool_calls is False


def test_stream_events_build_the_final_calls(client, model):
    kw = dict(model=model, input=QUESTION, tools=TOOLS, tool_choice="required",
              parallel_tool_calls=False, max_output_tokens=MAX_TOKENS, temperature=1.0,
              extra_body={"seed": 21})
    whole = client.responses.create(**kw)
    with client.responses.stream(**kw) as stream:
        events = list(stream)
        final = stream.get_final_response()
    types = [e.type for e in events]
    assert types[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert types[-3:] == ["response.function_call_arguments.done", "response.output_item.done",
                          "response.completed"]
    assert set(types[3:-3]) == {"response.function_call_arguments.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    added = events[2].item
    assert added.type == "function_call" and added.arguments == "" and \
        added.status == "in_progress"
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert {e.item_id for e in events if hasattr(e, "item_id")} == {added.id}
    assert events[-3].arguments == deltas
    assert len(final.output) == 1
    check_call(final.output[0])
    assert final.output[0].id == added.id and final.output[0].call_id == added.call_id
    # Same seed, same tokens: the streamed call is the non-streamed one.
    assert (final.output[0].name, final.output[0].arguments) == \
        (whole.output[0].name, whole.output[0].arguments) and deltas == whole.output[0].arguments


def test_function_call_output_round_trip(client, model):
    first = client.responses.create(model=model, input=QUESTION, tools=TOOLS,
                                    tool_choice="required", parallel_tool_calls=False,
                                    max_output_tokens=MAX_TOKENS, temperature=0)
    call = first.output[0]
    result = '{"temp_c": 21, "sky": "clear"}'
    # The agent loop: the model's items fed back as they came, then the call's result.
    items = [{"role": "user", "content": QUESTION}] + \
        [o.model_dump(exclude_none=True) for o in first.output] + \
        [{"type": "function_call_output", "call_id": call.call_id, "output": result}]
    second = client.responses.create(model=model, input=items, tools=TOOLS,
                                     max_output_tokens=16, temperature=0)
    turn = [{"role": "user", "content": QUESTION},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": call.call_id, "type": "function",
                 "function": {"name": call.name, "arguments": call.arguments}}]},
            {"role": "tool", "tool_call_id": call.call_id, "content": result}]
    chat = client.chat.completions.create(model=model, messages=turn, tools=CHAT_TOOLS,
                                          max_tokens=16, temperature=0)
    assert second.usage.input_tokens == chat.usage.prompt_tokens
    message = chat.choices[0].message
    if message.tool_calls:
        assert [(o.name, o.arguments) for o in second.output if o.type == "function_call"] == \
            [(c.function.name, c.function.arguments) for c in message.tool_calls]
    else:
        assert second.output_text == message.content


def test_tool_choice_none_is_plain_text(client, model):
    plain = client.responses.create(model=model, input=QUESTION, max_output_tokens=8,
                                    temperature=0)
    none = client.responses.create(model=model, input=QUESTION, tools=TOOLS, tool_choice="none",
                                   max_output_tokens=8, temperature=0)
    assert none.output_text == plain.output_text
    assert none.usage.input_tokens == plain.usage.input_tokens
    assert [o.type for o in none.output] == ["message"]


PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0}},
          "required": ["name", "age"], "additionalProperties": False}


def test_text_format_json_schema_equals_chat_and_validates(client, model):
    messages = [{"role": "user", "content": "Reply in JSON."}]
    chat = client.chat.completions.create(
        model=model, messages=messages, max_tokens=MAX_TOKENS, temperature=0,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "person", "schema": PERSON, "strict": True}})
    fmt = {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}
    r = client.responses.create(model=model, input="Reply in JSON.", max_output_tokens=MAX_TOKENS,
                                temperature=0, text={"format": fmt})
    assert r.status == "completed"
    assert r.output_text == chat.choices[0].message.content
    jsonschema.validate(json.loads(r.output_text), PERSON)
    assert r.text.format.type == "json_schema" and r.text.format.name == "person"
    for seed in (1, 2):
        s = client.responses.create(model=model, input="Reply in JSON.", temperature=1.0,
                                    max_output_tokens=MAX_TOKENS, text={"format": fmt},
                                    extra_body={"seed": seed})
        jsonschema.validate(json.loads(s.output_text), PERSON)
    # Streamed: the deltas join into a valid document too.
    with client.responses.stream(model=model, input="Reply in JSON.", temperature=0,
                                 max_output_tokens=MAX_TOKENS, text={"format": fmt}) as stream:
        text = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
    assert text == r.output_text


class Person(BaseModel):
    name: str
    age: int


def test_sdk_parse_with_a_pydantic_text_format(client, model):
    r = client.responses.parse(model=model, input="Reply in JSON.", text_format=Person,
                               max_output_tokens=MAX_TOKENS, temperature=0)
    assert isinstance(r.output_parsed, Person)
    assert r.output_parsed == Person.model_validate_json(r.output_text)


def test_text_format_json_object_equals_chat(client, model):
    # The embedded model does not close free-form JSON reliably (json_object is covered by
    # grammar_tests); here the constraint must act as chat's response_format does.
    chat = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Reply in JSON."}], max_tokens=12,
        temperature=0, response_format={"type": "json_object"})
    r = client.responses.create(model=model, input="Reply in JSON.", max_output_tokens=12,
                                temperature=0, text={"format": {"type": "json_object"}})
    assert r.output_text == chat.choices[0].message.content
    assert r.output_text.startswith("{")
    assert r.text.format.type == "json_object"
    plain = client.responses.create(model=model, input="Reply in JSON.", max_output_tokens=12,
                                    temperature=0)
    assert not plain.output_text.startswith("{")  # the constraint changed the output


@pytest.mark.parametrize("extra,param,words", [
    ({"tools": [{"type": "web_search"}]}, "tools", "of type 'web_search' is not supported"),
    ({"tools": [{"type": "function", "description": "no name"}]}, "tools",
     "tools[0].name is required"),
    ({"tools": [{"type": "function", "name": "f", "parameters": {
        "type": "object", "patternProperties": {"^a": {"type": "integer"}}}}]}, "tools",
     "tools[0].parameters"),
    ({"tools": TOOLS, "tool_choice": {"type": "file_search"}}, "tool_choice",
     "'tool_choice' of type 'file_search' is not supported"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice",
     "'nope', which is not in 'tools'"),
    ({"tool_choice": "required"}, "tool_choice", "needs at least one tool"),
    ({"parallel_tool_calls": "yes"}, "parallel_tool_calls", "must be a boolean"),
    ({"max_tool_calls": 1}, "max_tool_calls", "parallel_tool_calls: false"),
    ({"text": {"format": {"type": "json_schema", "schema": PERSON}}}, "text.format.name",
     "'text.format.name' is required"),
    ({"text": {"format": {"type": "json_schema", "name": "p", "schema": {
        "type": "object", "patternProperties": {"^a": {}}}}}}, "text.format", "patternProperties"),
    ({"text": {"format": {"type": "json_object"}, "verbosity": "low"}}, "text.verbosity",
     "no verbosity control"),
    ({"tools": TOOLS, "tool_choice": "required", "text": {"format": {"type": "json_object"}}},
     "text.format", "cannot be combined with tool_choice"),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, "input",
     "input[0].call_id is required"),
])
def test_unsupported_is_400_naming_the_field(client, model, extra, param, words):
    body = {"input": QUESTION, "max_output_tokens": 2}
    body.update(extra)
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=model, **{k: v for k, v in body.items()
                                                if k in ("input", "max_output_tokens")},
                                extra_body={k: v for k, v in body.items()
                                            if k not in ("input", "max_output_tokens")})
    assert e.value.body["param"] == param
    assert words in e.value.body["message"]
    assert client.responses.create(model=model, input=QUESTION,
                                   max_output_tokens=2).usage.output_tokens >= 1
