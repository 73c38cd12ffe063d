"""The API fields through the router (1 prefill + 1 decode worker): prompt logprobs come from
the prefill worker (carried in PrefillResponse) and give the reference perplexity on the
golden prompts; token constraints reach the workers; /v1/responses equals chat."""

import json
import math
import subprocess
import tempfile

import openai
import pytest

from golden_logprobs import ppl, read_golden, reference_logprobs
from sluice_cluster import MODEL_DIR, MODEL_NAME, Cluster, sluice_bin


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(num_prefill=1, num_decode=1)
    yield c
    c.stop()


@pytest.fixture(scope="module")
def client(cluster):
    return openai.OpenAI(base_url=cluster.url + "/v1", api_key="x", max_retries=0, timeout=300)


def remote_prefills(cluster):
    import urllib.request
    with urllib.request.urlopen(cluster.url + "/metrics", timeout=30) as r:
        text = r.read().decode()
    for line in text.splitlines():
        if line.startswith('sluice_router_prefills_total{where="remote"}'):
            return float(line.split()[-1])
    raise AssertionError("no remote prefill counter")


def test_echo_logprobs_perplexity_through_the_router(cluster, client):
    golden = read_golden(MODEL_DIR / "golden.safetensors")
    before = remote_prefills(cluster)
    for i in (0, 1, 2, 3):
        ids, want = reference_logprobs(golden, i)
        r = client.completions.create(model=MODEL_NAME, prompt=ids, max_tokens=2, echo=True,
                                      logprobs=1, temperature=0)
        got = r.choices[0].logprobs.token_logprobs[1:len(ids)]
        assert r.choices[0].logprobs.token_logprobs[0] is None
        assert math.isclose(ppl(got), ppl(want), rel_tol=1e-4), (i, ppl(got), ppl(want))
    # The prompts were prefilled (and scored) on the prefill worker.
    assert remote_prefills(cluster) - before >= 1
    # `sluice eval ppl` against the router.
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("Ge1:1 In the beginning God created the heaven and the earth.\n")
        path = f.name
    out = subprocess.run([sluice_bin(), "eval", "ppl", path, "--url", cluster.url],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["num_tokens"] > 5 and 1.0 < result["ppl"] < 1e4


def test_token_constraints_reach_the_workers(client):
    r = client.completions.create(model=MODEL_NAME, prompt="Ge1:1 In the", max_tokens=6,
                                  temperature=0, logprobs=0, logit_bias={"300": 100},
                                  extra_body={"ignore_eos": True,
                                              "return_tokens_as_token_ids": True})
    assert r.choices[0].logprobs.tokens == ["token_id:300"] * 6
    allowed = [300, 301, 302]
    r = client.completions.create(model=MODEL_NAME, prompt="Ge1:1 In the", max_tokens=6,
                                  temperature=1.0, seed=1, logprobs=0,
                                  extra_body={"allowed_token_ids": allowed, "ignore_eos": True,
                                              "return_tokens_as_token_ids": True})
    assert {int(t.split(":")[1]) for t in r.choices[0].logprobs.tokens} <= set(allowed)


def test_responses_through_the_router(client):
    q = "Who made the heaven and the earth?"
    want = client.chat.completions.create(model=MODEL_NAME, max_tokens=8, temperature=0,
                                          messages=[{"role": "user", "content": q}])
    r = client.responses.create(model=MODEL_NAME, input=q, max_output_tokens=8, temperature=0)
    assert r.output_text == want.choices[0].message.content
    with client.responses.stream(model=MODEL_NAME, input=q, max_output_tokens=8,
                                 temperature=0) as stream:
        text = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        final = stream.get_final_response()
    assert text == final.output_text == r.output_text


def test_responses_tools_and_text_format_through_the_router(client):
    # /v1/responses function calls and text.format take chat's path: the same grammar, sent to
    # the workers as text, and the same calls as chat for the same seed.
    import jsonschema
    zone = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET", "PST"]}},
            "required": ["zone"]}
    q = "What time is it?"
    chat = client.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": q}], max_tokens=300,
        temperature=1.0, seed=5, tool_choice={"type": "function", "function": {"name": "get_time"}},
        tools=[{"type": "function", "function": {"name": "get_time", "parameters": zone}}])
    kw = dict(model=MODEL_NAME, input=q, max_output_tokens=300, temperature=1.0,
              tools=[{"type": "function", "name": "get_time", "parameters": zone}],
              tool_choice={"type": "function", "name": "get_time"}, extra_body={"seed": 5})
    r = client.responses.create(**kw)
    (call,) = r.output
    assert call.type == "function_call" and call.name == "get_time"
    assert call.arguments == chat.choices[0].message.tool_calls[0].function.arguments
    jsonschema.validate(json.loads(call.arguments), zone)
    with client.responses.stream(**kw) as stream:
        args = "".join(e.delta for e in stream
                       if e.type == "response.function_call_arguments.delta")
    assert args == call.arguments
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    r = client.responses.create(model=MODEL_NAME, input="JSON?", max_output_tokens=100,
                                temperature=0, text={"format": {"type": "json_schema",
                                                                "name": "x", "schema": schema}})
    assert isinstance(json.loads(r.output_text)["ok"], bool)


def test_tools_through_the_router(client):
    # The router renders the tools, compiles the grammar of "required" / a named function and
    # sends it to the workers as text (SamplingParams.grammar_ebnf); prefill samples the first
    # token under it and decode continues from there.
    import jsonschema
    zone = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET", "PST"]}},
            "required": ["zone"]}
    tools = [{"type": "function", "function": {"name": "get_time", "parameters": zone}}]
    msg = [{"role": "user", "content": "What time is it?"}]
    plain = client.chat.completions.create(model=MODEL_NAME, messages=msg, max_tokens=8,
                                           temperature=0)
    auto = client.chat.completions.create(model=MODEL_NAME, messages=msg, tools=tools,
                                          max_tokens=8, temperature=0)
    assert auto.usage.prompt_tokens > plain.usage.prompt_tokens  # the template got the tools
    assert auto.choices[0].finish_reason in ("stop", "length", "tool_calls")
    none = client.chat.completions.create(model=MODEL_NAME, messages=msg, tools=tools,
                                          tool_choice="none", max_tokens=8, temperature=0)
    assert none.choices[0].message.content == plain.choices[0].message.content
    kw = dict(model=MODEL_NAME, messages=msg, tools=tools, max_tokens=300, temperature=1.0,
              seed=3, tool_choice={"type": "function", "function": {"name": "get_time"}})
    r = client.chat.completions.create(**kw)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls"
    (call,) = c.message.tool_calls
    assert call.function.name == "get_time"
    jsonschema.validate(json.loads(call.function.arguments), zone)
    args = ""
    for chunk in client.chat.completions.create(stream=True, **kw):
        for ch in chunk.choices:
            for entry in ch.delta.tool_calls or []:
                args += entry.function.arguments or ""
    assert args == call.function.arguments  # same seed, same tokens


def test_structured_output_through_the_router(client):
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0,
                                                     "maximum": 99},
                                               "ok": {"type": "boolean"}},
              "required": ["n", "ok"], "additionalProperties": False}
    rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}
    for seed in (1, 2):
        r = client.chat.completions.create(model=MODEL_NAME, max_tokens=200, temperature=1.0,
                                           seed=seed, response_format=rf,
                                           messages=[{"role": "user", "content": "JSON?"}])
        value = json.loads(r.choices[0].message.content)
        assert set(value) == {"n", "ok"} and 0 <= value["n"] <= 99
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL_NAME, max_tokens=8,
                                       messages=[{"role": "user", "content": "JSON?"}],
                                       response_format={"type": "json_schema", "json_schema": {
                                           "name": "x", "schema": {"enum": []}}})
    assert e.value.body["param"] == "response_format"
    # The SDK's parse helper with a Pydantic model, through the router.
    from pydantic import BaseModel

    class Count(BaseModel):
        n: int
        ok: bool

    parsed = client.beta.chat.completions.parse(model=MODEL_NAME, response_format=Count,
                                                max_tokens=200, temperature=0,
                                                messages=[{"role": "user", "content": "JSON?"}])
    assert isinstance(parsed.choices[0].message.parsed, Count)


def test_sdk_helpers_parse_tools_and_structured_outputs_through_the_router(client):
    # The official SDK's helpers through the router, streamed and not: chat.completions.stream
    # (beta) with a Pydantic response_format and with a strict Pydantic tool, and parse with the
    # tool; the streamed and the non-streamed runs of one seed give the same parsed values.
    from pydantic import BaseModel

    class Count(BaseModel):
        n: int
        ok: bool

    class Lookup(BaseModel):
        city: str
        days: int

    msg = [{"role": "user", "content": "JSON?"}]
    kw = dict(model=MODEL_NAME, messages=msg, max_tokens=200, temperature=1.0, seed=5)
    parsed = client.beta.chat.completions.parse(response_format=Count, **kw).choices[0].message.parsed
    assert isinstance(parsed, Count)
    with client.beta.chat.completions.stream(response_format=Count, **kw) as stream:
        deltas = [e for e in stream if e.type == "content.delta"]
        final = stream.get_final_completion()
    assert deltas and final.choices[0].message.parsed == parsed

    tool = openai.pydantic_function_tool(Lookup, name="lookup")
    tool["function"]["parameters"]["properties"]["city"]["maxLength"] = 10
    kw = dict(model=MODEL_NAME, messages=msg, tools=[tool], tool_choice="required", max_tokens=200,
              temperature=1.0, seed=4)
    with client.beta.chat.completions.stream(**kw) as stream:
        done = [e for e in stream if e.type == "tool_calls.function.arguments.done"]
        final = stream.get_final_completion()
    assert done and done[0].name == "lookup"
    assert final.choices[0].finish_reason == "tool_calls"
    streamed = final.choices[0].message.tool_calls[0].function.parsed_arguments
    assert isinstance(streamed, Lookup)
    call = client.beta.chat.completions.parse(**kw).choices[0].message.tool_calls[0]
    assert call.function.name == "lookup" and call.function.parsed_arguments == streamed
