"""DeepSeek-V3 tool calls constrained end to end: tool_choice "required" and a named function
through `sluice serve` on a model whose tool-call markers are special tokens.

The model folder is built here from the embedded sluice-mini-moe (a DeepSeek-V3 architecture
model): its weights and config, a tokenizer whose five last BPE merges give their ids to
DeepSeek's markers (<｜tool▁calls▁begin｜> ... as special added tokens), and a chat template
that writes calls the way DeepSeek-V3's does. The grammar must emit those markers as the
special tokens themselves (text never spells them), so the output parses into calls of the
forced function whose arguments validate against its parameters (`jsonschema`).
"""

import json
import pathlib

import jsonschema
import openai
import pytest
import tokenizers

from conftest import MODEL_DIR, ServerProcess

MARKERS = ["<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>",
           "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"]
TEMPLATE = """{{- bos_token -}}
{%- if tools -%}
{{- '<|system|>\\nYou can call these functions:' -}}
{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}
{{- eos_token + '\\n' -}}
{%- endif -%}
{%- for message in messages -%}
{%- if message['role'] == 'user' -%}
{{- '<|user|>\\n' + message['content'] + eos_token + '\\n' -}}
{%- elif message['role'] == 'assistant' -%}
{{- '<|assistant|>\\n' -}}
{%- if message['content'] -%}{{- message['content'] -}}{%- endif -%}
{%- if message['tool_calls'] is defined and message['tool_calls'] -%}
{{- '<｜tool▁calls▁begin｜>' -}}
{%- for call in message['tool_calls'] -%}
{%- if not loop.first -%}{{- '\\n' -}}{%- endif -%}
{{- '<｜tool▁call▁begin｜>' + call['type'] + '<｜tool▁sep｜>' + call['function']['name'] + '\\n```json\\n' + (call['function']['arguments'] | tojson) + '\\n```<｜tool▁call▁end｜>' -}}
{%- endfor -%}
{{- '<｜tool▁calls▁end｜>' -}}
{%- endif -%}
{{- eos_token + '\\n' -}}
{%- elif message['role'] == 'tool' -%}
{{- '<|tool|>\\n' + message['content'] + eos_token + '\\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|assistant|>\\n' -}}{%- endif -%}
"""

MSG = [{"role": "user", "content": "What is the weather in Oslo?"}]
WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 10}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET", "PST"]}},
        "required": ["zone"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": TIME}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}


def make_model(folder: pathlib.Path):
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        (folder / name).symlink_to(MODEL_DIR / name)
    (folder / "tokenizer_config.json").write_text((MODEL_DIR / "tokenizer_config.json").read_text())
    (folder / "chat_template.jinja").write_text(TEMPLATE)
    tok = json.loads((MODEL_DIR / "tokenizer.json").read_text())
    merges = tok["model"]["merges"]
    vocab = tok["model"]["vocab"]
    ids = []
    for merge in merges[-len(MARKERS):]:
        left, right = merge if isinstance(merge, list) else merge.split(" ")
        ids.append(vocab.pop(left + right))
    del merges[-len(MARKERS):]
    for marker, i in zip(MARKERS, sorted(ids)):
        tok["added_tokens"].append({"id": i, "content": marker, "single_word": False,
                                    "lstrip": False, "rstrip": False, "normalized": False,
                                    "special": True})
    (folder / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False))


@pytest.fixture(scope="module")
def ds_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("deepseek-tools")
    make_model(folder)
    return folder


@pytest.fixture(scope="module")
def ds_client(ds_folder):
    server = ServerProcess(model_dir=ds_folder)
    try:
        yield openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=300)
    finally:
        assert server.stop() == 0, server.logs()


def raw_text(choice):
    return "".join(t.token for t in choice.logprobs.content)


def check_exact(choice, names):
    """The output is exactly the calls in DeepSeek's format, each of an allowed function with
    schema-valid arguments, and the API returns those calls."""
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.content is None
    calls = choice.message.tool_calls
    assert calls
    body = "\n".join(f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{c.function.name}\n```json\n"
                     f"{c.function.arguments}\n```<｜tool▁call▁end｜>" for c in calls)
    # The output keeps special tokens (the parser needs the markers): EOS ends it.
    assert raw_text(choice) == ("<｜tool▁calls▁begin｜>" + body + "<｜tool▁calls▁end｜>"
                                "<|end_of_text|>")
    # The markers came out as the special tokens themselves, one token each.
    tokens = [t.token for t in choice.logprobs.content]
    assert tokens[:2] == ["<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>"]
    assert tokens[-3:] == ["<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>", "<|end_of_text|>"]
    for c in calls:
        assert c.function.name in names
        assert c.id.startswith("call_")
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])
    return calls


def test_named_function_greedy_and_sampled(ds_client):
    model = ds_client.models.list().data[0].id
    named = {"type": "function", "function": {"name": "get_weather"}}
    for kw in ({"temperature": 0}, {"temperature": 1.0, "n": 3, "seed": 7}):
        r = ds_client.chat.completions.create(model=model, messages=MSG, tools=TOOLS,
                                              tool_choice=named, max_tokens=200, logprobs=True,
                                              **kw)
        for choice in r.choices:
            (call,) = check_exact(choice, ("get_weather",))


def test_required_calls_either_function(ds_client):
    model = ds_client.models.list().data[0].id
    # One call each: the embedded model, never trained on tools, writes call after call when
    # parallel calls are allowed (those: tool_call_tests ToolGrammar.DeepSeek*).
    for kw in ({"temperature": 1.0, "n": 3, "seed": 11}, {"temperature": 0}):
        r = ds_client.chat.completions.create(model=model, messages=MSG, tools=TOOLS,
                                              tool_choice="required", max_tokens=300,
                                              logprobs=True, parallel_tool_calls=False, **kw)
        for choice in r.choices:
            calls = check_exact(choice, ("get_weather", "get_time"))
            assert len(calls) == 1


def test_streamed_calls_match(ds_client):
    model = ds_client.models.list().data[0].id
    kw = dict(model=model, messages=MSG, tools=TOOLS, max_tokens=200, temperature=1.0, seed=3,
              tool_choice={"type": "function", "function": {"name": "get_time"}})
    whole = ds_client.chat.completions.create(**kw).choices[0].message.tool_calls
    calls, finish = {}, None
    for chunk in ds_client.chat.completions.create(stream=True, **kw):
        for ch in chunk.choices:
            assert not ch.delta.content
            for entry in ch.delta.tool_calls or []:
                got = calls.setdefault(entry.index, {"name": entry.function.name, "args": ""})
                got["args"] += entry.function.arguments or ""
            finish = ch.finish_reason or finish
    assert finish == "tool_calls"
    assert calls == {0: {"name": "get_time", "args": whole[0].function.arguments}}
    jsonschema.validate(json.loads(calls[0]["args"]), TIME)


def test_calls_and_results_render_on_the_next_turn(ds_client, ds_folder):
    model = ds_client.models.list().data[0].id
    first = ds_client.chat.completions.create(
        model=model, messages=MSG, tools=TOOLS, max_tokens=200, temperature=0,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    call = first.choices[0].message.tool_calls[0]
    turn = MSG + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.id, "type": "function",
             "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"temp_c": 21}'},
    ]
    second = ds_client.chat.completions.create(model=model, messages=turn, tools=TOOLS,
                                               max_tokens=8, temperature=0)
    assert second.choices[0].finish_reason in ("stop", "length", "tool_calls")
    # The template's rendering written out: the markers in the history are the special tokens.
    args = json.dumps(json.loads(call.function.arguments))
    text = ("<|begin_of_text|><|system|>\nYou can call these functions:"
            + "".join("\n" + json.dumps(t) for t in TOOLS) + "<|end_of_text|>\n"
            + "<|user|>\n" + MSG[0]["content"] + "<|end_of_text|>\n<|assistant|>\n"
            + "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
            + args + "\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜><|end_of_text|>\n"
            + "<|tool|>\n{\"temp_c\": 21}<|end_of_text|>\n<|assistant|>\n")
    tok = tokenizers.Tokenizer.from_file(str(ds_folder / "tokenizer.json"))
    ids = tok.encode(text, add_special_tokens=False).ids
    assert second.usage.prompt_tokens == len(ids)
    marker_ids = {tok.token_to_id(m) for m in MARKERS}
    assert sum(i in marker_ids for i in ids) == 5
