"""Tool calling end to end through `sluice serve` (embedded model, whose chat_template.jinja
writes Hermes-style <tool_call> blocks): tool_choice "required" and a named function are
grammar-constrained, so every call parses and its arguments validate against the function's
parameters with `jsonschema`, greedy and at temperature 1 with several seeds; streamed
tool_calls deltas follow OpenAI (index on every entry; id, type and name first; argument
fragments join into the same JSON as the non-streamed call); assistant tool_calls and tool
results render through the template on the next turn; bad tools are 400s naming the field.
"""

import json
import subprocess

import jsonschema
import openai
import pytest
import tokenizers
from pydantic import BaseModel

from conftest import MODEL_DIR, sluice_bin

MSG = [{"role": "user", "content": "What is the weather in Oslo?"}]
WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 10}, "unit": {"enum": ["c", "f"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "unit"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET", "PST"]}},
        "required": ["zone"]}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather now",
                                      "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
MAX_TOKENS = 400


def check_calls(message, names=("get_weather", "get_time")):
    assert message.tool_calls, message
    for call in message.tool_calls:
        assert call.type == "function"
        assert call.id.startswith("call_") and len(call.id) == 29
        assert call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    assert len({c.id for c in message.tool_calls}) == len(message.tool_calls)


def test_required_greedy_and_sampled(client, model):
    # Parallel calls (the default) end where the model writes EOS after a call; the embedded
    # model, never trained on tools, often writes another call instead, so the sampled runs
    # ask for one call (parallel calls: tool_call_tests ToolGrammar and the greedy run here).
    for kw in ({"temperature": 0},
               {"temperature": 1.0, "n": 3, "seed": 5, "parallel_tool_calls": False},
               {"temperature": 1.0, "n": 3, "seed": 99, "parallel_tool_calls": False}):
        r = client.chat.completions.create(model=model, messages=MSG, tools=TOOLS,
                                           tool_choice="required", max_tokens=MAX_TOKENS, **kw)
        for c in r.choices:
            assert c.finish_reason == "tool_calls", c
            assert c.message.content is None
            check_calls(c.message)


def test_named_function_and_no_parallel_calls(client, model):
    r = client.chat.completions.create(
        model=model, messages=MSG, tools=TOOLS, max_tokens=MAX_TOKENS, temperature=1.0, n=3,
        seed=3, tool_choice={"type": "function", "function": {"name": "get_time"}})
    for c in r.choices:
        assert c.finish_reason == "tool_calls"
        assert len(c.message.tool_calls) == 1
        check_calls(c.message, names=("get_time",))
    r = client.chat.completions.create(model=model, messages=MSG, tools=TOOLS, n=3, seed=8,
                                       tool_choice="required", parallel_tool_calls=False,
                                       max_tokens=MAX_TOKENS, temperature=1.0)
    for c in r.choices:
        assert len(c.message.tool_calls) == 1
        check_calls(c.message)


def test_streamed_tool_calls_match_the_non_streamed_ones(client, model):
    kw = dict(model=model, messages=MSG, tools=TOOLS, tool_choice="required",
              parallel_tool_calls=False, max_tokens=MAX_TOKENS, temperature=1.0, seed=21)
    whole = client.chat.completions.create(**kw).choices[0].message
    calls = {}
    finish = None
    for chunk in client.chat.completions.create(stream=True, **kw):
        for choice in chunk.choices:
            assert choice.delta.content in (None, "")
            for entry in choice.delta.tool_calls or []:
                assert entry.index is not None
                if entry.index not in calls:
                    # The first fragment of a call: id, type and the name.
                    assert entry.id.startswith("call_") and entry.type == "function"
                    assert entry.function.name
                    calls[entry.index] = {"id": entry.id, "name": entry.function.name, "args": ""}
                else:
                    assert entry.id is None and entry.function.name is None
                calls[entry.index]["args"] += entry.function.arguments or ""
            finish = choice.finish_reason or finish
    assert finish == "tool_calls"
    assert sorted(calls) == list(range(len(whole.tool_calls)))
    for i, call in enumerate(whole.tool_calls):
        assert calls[i]["name"] == call.function.name
        assert calls[i]["args"] == call.function.arguments  # same seed, same tokens
        jsonschema.validate(json.loads(calls[i]["args"]), SCHEMAS[call.function.name])


class Lookup(BaseModel):
    city: str
    days: int


def test_sdk_stream_helper_parses_strict_tools(client, model):
    tool = openai.pydantic_function_tool(Lookup, name="lookup")
    tool["function"]["parameters"]["properties"]["city"]["maxLength"] = 10
    with client.beta.chat.completions.stream(model=model, messages=MSG, tools=[tool],
                                             tool_choice="required", max_tokens=MAX_TOKENS,
                                             temperature=1.0, seed=4) as stream:
        done = [e for e in stream if e.type == "tool_calls.function.arguments.done"]
        final = stream.get_final_completion()
    assert done and done[0].name == "lookup"
    call = final.choices[0].message.tool_calls[0]
    assert isinstance(call.function.parsed_arguments, Lookup)
    assert final.choices[0].finish_reason == "tool_calls"
    parsed = client.beta.chat.completions.parse(model=model, messages=MSG, tools=[tool],
                                                tool_choice="required", max_tokens=MAX_TOKENS,
                                                temperature=0)
    assert isinstance(parsed.choices[0].message.tool_calls[0].function.parsed_arguments, Lookup)


def render(messages, tools=None):
    """The embedded template's rendering, written out by hand (models/sluice-mini-moe/
    chat_template.jinja), for the prompt-token checks. Tools and call arguments keep the
    client's key order, as transformers renders them."""
    out = "<|begin_of_text|>"
    if tools:
        out += ("<|system|>\nYou can call these functions (one JSON signature per line):\n<tools>"
                + "".join("\n" + json.dumps(t) for t in tools)
                + "\n</tools>\nTo call functions, reply with one block per call, each on its own "
                "lines:\n<tool_call>\n{\"name\": <function name>, \"arguments\": <JSON object>}\n"
                "</tool_call><|end_of_text|>\n")
    for m in messages:
        body = (m.get("content") or "").strip()
        for i, c in enumerate(m.get("tool_calls") or []):
            sep = "\n" if (i or body) else ""
            args = json.dumps(json.loads(c["function"]["arguments"]))
            body += f'{sep}<tool_call>\n{{"name": "{c["function"]["name"]}", "arguments": {args}}}\n</tool_call>'
        out += f"<|{m['role']}|>\n{body}<|end_of_text|>\n"
    return out + "<|assistant|>\n"


def prompt_tokens(text):
    tok = tokenizers.Tokenizer.from_file(str(MODEL_DIR / "tokenizer.json"))
    return len(tok.encode(text, add_special_tokens=False).ids)


def test_tool_results_go_back_through_the_template(client, model):
    first = client.chat.completions.create(model=model, messages=MSG, tools=TOOLS,
                                           tool_choice="required", parallel_tool_calls=False,
                                           max_tokens=MAX_TOKENS, temperature=0)
    assert first.usage.prompt_tokens == prompt_tokens(render(MSG, TOOLS))
    call = first.choices[0].message.tool_calls[0]
    turn = MSG + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.id, "type": "function",
             "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"temp_c": 21, "sky": "clear"}'},
    ]
    second = client.chat.completions.create(model=model, messages=turn, tools=TOOLS,
                                            max_tokens=16, temperature=0)
    assert second.usage.prompt_tokens == prompt_tokens(render(turn, TOOLS))
    c = second.choices[0]
    assert c.finish_reason in ("stop", "length", "tool_calls")
    if c.finish_reason != "tool_calls":
        assert c.message.tool_calls is None and isinstance(c.message.content, str)
    # Streamed auto: content deltas only unless the model writes a call.
    text = ""
    for chunk in client.chat.completions.create(model=model, messages=turn, tools=TOOLS,
                                                max_tokens=16, temperature=0, stream=True):
        for ch in chunk.choices:
            text += ch.delta.content or ""
    if c.finish_reason != "tool_calls":
        assert text == c.message.content


def test_tool_choice_none_renders_no_tools(client, model):
    plain = client.chat.completions.create(model=model, messages=MSG, max_tokens=8, temperature=0)
    none = client.chat.completions.create(model=model, messages=MSG, max_tokens=8, temperature=0,
                                          tools=TOOLS, tool_choice="none")
    assert none.usage.prompt_tokens == plain.usage.prompt_tokens == prompt_tokens(render(MSG))
    assert none.choices[0].message.content == plain.choices[0].message.content
    assert none.choices[0].message.tool_calls is None


BAD = [
    ({"tools": {"type": "function"}}, "tools", "must be a list"),
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools",
     "function.name is required"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "patternProperties": {"^a": {"type": "integer"}}}}}]}, "tools",
     "patternProperties"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"enum": []}}}}}]}, "tools", "enum"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice", "'nope'"),
    ({"tool_choice": "required"}, "tool_choice", "at least one tool"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice", "sometimes"),
    ({"tools": TOOLS, "tool_choice": "required",
      "response_format": {"type": "json_object"}}, "tool_choice", "response_format"),
    ({"messages": MSG + [{"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{bad"}}]}]},
     "messages", "not valid JSON"),
]


@pytest.mark.parametrize("extra,param,words", BAD, ids=[f"{b[1]}-{i}" for i, b in enumerate(BAD)])
def test_bad_tools_are_400_naming_the_field(client, model, extra, param, words):
    body = {"messages": MSG, "max_tokens": 4, **extra}
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, **body)
    err = e.value.body
    assert err["param"] == param, err
    assert words in err["message"], err
    ok = client.chat.completions.create(model=model, messages=MSG, max_tokens=2)
    assert ok.choices[0].finish_reason in ("stop", "length")


def test_generate_lines_carry_tools(tmp_path):
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    lines = [{"custom_id": "t", "messages": MSG, "tools": TOOLS, "max_tokens": MAX_TOKENS,
              "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
              "temperature": 1.0, "seed": 2},
             {"custom_id": "bad", "messages": MSG, "tools": TOOLS, "tool_choice": "required",
              "functions": [{"name": "f"}]}]
    src.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    proc = subprocess.run([sluice_bin(), "generate", "--model", str(MODEL_DIR), "--input",
                           str(src), "--output", str(dst)], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    out = [json.loads(line) for line in dst.read_text().splitlines()]
    choice = out[0]["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    jsonschema.validate(json.loads(call["function"]["arguments"]), WEATHER)
    assert out[1]["error"]["param"] == "functions"


def test_auto_parses_calls_the_model_writes(client, model):
    # Make the model write a call under tool_choice "auto" by constraining its text with a
    # grammar (the embedded model writes none on its own): the auto parser must find it,
    # streamed (n=2) and not, and text without calls stays content.
    call = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>'
    grammar = 'root ::= "Checking. " ' + json.dumps(call) + ' | "No call needed."'
    kw = dict(model=model, messages=MSG, tools=TOOLS, max_tokens=MAX_TOKENS, temperature=1.0,
              seed=1, n=2, extra_body={"structured_outputs": {"grammar": grammar}})
    r = client.chat.completions.create(**kw)
    # Seed 1 takes both branches (text in choice 0, a call in choice 1).
    assert [bool(c.message.tool_calls) for c in r.choices] == [False, True]
    streamed = {i: {"content": "", "calls": {}, "finish": None} for i in range(2)}
    for chunk in client.chat.completions.create(stream=True, **kw):
        for ch in chunk.choices:
            s = streamed[ch.index]
            s["content"] += ch.delta.content or ""
            for entry in ch.delta.tool_calls or []:
                got = s["calls"].setdefault(entry.index, {"name": entry.function.name, "args": ""})
                got["args"] += entry.function.arguments or ""
            s["finish"] = ch.finish_reason or s["finish"]
    for c in r.choices:
        s = streamed[c.index]
        assert s["finish"] == c.finish_reason
        if c.message.tool_calls:
            assert c.finish_reason == "tool_calls"
            assert c.message.content == "Checking." == s["content"]
            assert [(t.function.name, t.function.arguments) for t in c.message.tool_calls] == [
                ("get_time", '{"zone": "CET"}')]
            assert s["calls"] == {0: {"name": "get_time", "args": '{"zone": "CET"}'}}
        else:
            assert c.finish_reason == "stop"
            assert c.message.content == "No call needed." == s["content"]
            assert s["calls"] == {}


def test_tool_call_parser_flag_overrides_the_template():
    # --tool-call-parser llama3_json: "required" output is {"name": ..., "parameters": ...}
    # (the grammar follows the parser's syntax), parsed back into tool_calls.
    from conftest import MODEL_NAME, ServerProcess
    server = ServerProcess(["--tool-call-parser", "llama3_json"])
    try:
        c = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
        kw = dict(model=MODEL_NAME, messages=MSG, tools=TOOLS, max_tokens=MAX_TOKENS,
                  temperature=1.0, seed=6, tool_choice={"type": "function",
                                                        "function": {"name": "get_time"}},
                  logprobs=True)
        r = c.chat.completions.create(**kw)
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls"
        text = "".join(t.token for t in choice.logprobs.content)
        assert text.startswith('{"name": "get_time", "parameters": ')
        (call,) = choice.message.tool_calls
        assert call.function.name == "get_time"
        jsonschema.validate(json.loads(call.function.arguments), TIME)
    finally:
        assert server.stop() == 0
