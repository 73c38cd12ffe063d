"""The public gRPC API (sluice.v1.Inference) of `sluice router` and `sluice serve --grpc-port`.

Stubs are generated at test time from proto/sluice/v1 with grpcio-tools (pinned in
tests/requirements.txt). Checked against a real client:
- greedy Generate returns what the HTTP API returns for the same request (chat and text prompts,
  stop strings), on the router (remote prefill + decode workers) and on `sluice serve`;
- Tokenize / ListModels / Health;
- bad input gets the right status code with a message naming the field;
- cancelling a stream aborts the request and its KV blocks return to free.
Every wait has a deadline.
"""

import json
import tempfile
import urllib.error

import grpc
import openai
import pytest

from grpc_stubs import common, modules, pb, pb_grpc  # generated from proto/ at import
from sluice_cluster import (MODEL_DIR, MODEL_NAME, STARTUP_TIMEOUT_S, Cluster, Proc, free_port,
                            http_get, sluice_bin, wait_until)

RPC_TIMEOUT_S = 60


class Endpoint:
    """One server's HTTP base URL and gRPC stub."""

    def __init__(self, url, grpc_address, kv_metrics_url):
        self.url = url
        self.channel = grpc.insecure_channel(grpc_address)
        self.stub = pb_grpc.InferenceStub(self.channel)
        self.http = openai.OpenAI(base_url=url + "/v1", api_key="x", timeout=RPC_TIMEOUT_S,
                                  max_retries=0)
        self.kv_metrics_url = kv_metrics_url

    def metric(self, name):
        total = 0.0
        for line in http_get(self.kv_metrics_url)[1].splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                total += float(line.rsplit(" ", 1)[1])
        return total


@pytest.fixture(scope="module")
def router():
    c = Cluster(num_prefill=1, num_decode=1)
    yield Endpoint(c.url, f"127.0.0.1:{c.grpc_port}", c.url + "/metrics")
    c.stop()


@pytest.fixture(scope="module")
def serve():
    log_dir = tempfile.mkdtemp(prefix="sluice-grpc-serve-")
    port, grpc_port = free_port(), free_port()
    proc = Proc("serve", [sluice_bin(), "serve", "--model", str(MODEL_DIR), "--port", str(port),
                          "--grpc-port", str(grpc_port)], log_dir)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: http_get(url + "/health")[0] == 200, STARTUP_TIMEOUT_S,
                   "sluice serve /health")
        yield Endpoint(url, f"127.0.0.1:{grpc_port}", url + "/metrics")
    finally:
        proc.stop()


@pytest.fixture(params=["router", "serve"])
def endpoint(request):
    return request.getfixturevalue(request.param)


def chat_request(content, max_tokens=24, **sampling):
    return pb.GenerateRequest(
        model=MODEL_NAME,
        chat=pb.ChatPrompt(messages=[pb.ChatMessage(role="user", content=content)],
                           add_generation_prompt=True),
        sampling=common.SamplingParams(**{"temperature": 0.0, "max_tokens": max_tokens,
                                          **sampling}),
        detokenize=True)


def run_generate(endpoint, request):
    """Returns (text, token ids, finish reason name, final usage) of a Generate stream."""
    text, ids, finish, usage = "", [], None, None
    for message in endpoint.stub.Generate(request, timeout=RPC_TIMEOUT_S):
        text += message.text
        ids.extend(t.token_id for t in message.tokens)
        usage = message.usage
        if message.finish_reason:
            finish = common.FinishReason.Name(message.finish_reason)
    return text, ids, finish, usage


FINISH = {"stop": "FINISH_REASON_STOP", "length": "FINISH_REASON_LENGTH"}


@pytest.mark.parametrize("content", ["Quote Genesis 1:3.", "Name three colors of the sky."])
def test_greedy_chat_generate_equals_http(endpoint, content):
    http = endpoint.http.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": content}], temperature=0,
        max_tokens=24)
    text, ids, finish, usage = run_generate(endpoint, chat_request(content))
    assert text == http.choices[0].message.content
    assert finish == FINISH[http.choices[0].finish_reason]
    assert len(ids) == http.usage.completion_tokens == usage.completion_tokens
    assert usage.prompt_tokens == http.usage.prompt_tokens


def test_text_prompt_with_logprobs_and_stop_equals_http(endpoint):
    prompt = "In the beginning God created"
    http = endpoint.http.completions.create(model=MODEL_NAME, prompt=prompt, temperature=0,
                                            max_tokens=20, logprobs=2, stop=[" and"])
    request = pb.GenerateRequest(
        model=MODEL_NAME, text=prompt, detokenize=True,
        sampling=common.SamplingParams(temperature=0.0, max_tokens=20, logprobs=2,
                                       stop=[" and"]))
    tokens, text, finish = [], "", None
    for message in endpoint.stub.Generate(request, timeout=RPC_TIMEOUT_S):
        tokens.extend(message.tokens)
        text += message.text
        if message.finish_reason:
            finish = common.FinishReason.Name(message.finish_reason)
    choice = http.choices[0]
    assert text == choice.text
    assert finish == FINISH[choice.finish_reason]
    assert len(tokens) == len(choice.logprobs.token_logprobs)
    for token, logprob in zip(tokens, choice.logprobs.token_logprobs):
        assert token.logprob == pytest.approx(logprob, abs=1e-4)
        assert len(token.top_logprobs) == 2


def test_token_id_prompt_and_tokenize(endpoint):
    tokenized = endpoint.stub.Tokenize(
        pb.TokenizeRequest(model=MODEL_NAME, text="Quote Genesis 1:3.", add_special_tokens=True),
        timeout=RPC_TIMEOUT_S)
    assert len(tokenized.token_ids) > 3 and tokenized.max_model_len > 0
    by_ids = pb.GenerateRequest(model=MODEL_NAME, token_ids=pb.TokenIds(ids=tokenized.token_ids),
                                detokenize=True,
                                sampling=common.SamplingParams(temperature=0.0, max_tokens=12))
    by_text = pb.GenerateRequest(model=MODEL_NAME, text="Quote Genesis 1:3.", detokenize=True,
                                 sampling=common.SamplingParams(temperature=0.0, max_tokens=12))
    ids_out, text_out = run_generate(endpoint, by_ids), run_generate(endpoint, by_text)
    assert ids_out[:3] == text_out[:3]
    assert ids_out[3].prompt_tokens == len(tokenized.token_ids)
    # The chat template is applied as for a chat Generate.
    chat = endpoint.stub.Tokenize(pb.TokenizeRequest(chat=chat_request("Hi").chat),
                                  timeout=RPC_TIMEOUT_S)
    assert len(chat.token_ids) == run_generate(endpoint, chat_request("Hi", 2))[3].prompt_tokens


def test_list_models_and_health(endpoint):
    models = endpoint.stub.ListModels(pb.ListModelsRequest(), timeout=RPC_TIMEOUT_S).models
    assert [m.id for m in models] == [MODEL_NAME]
    assert models[0].max_model_len > 0 and models[0].owned_by == "sluice"
    health = endpoint.stub.Health(pb.HealthRequest(), timeout=RPC_TIMEOUT_S)
    assert health.status == pb.HealthResponse.SERVING


def expect_error(endpoint, request, code, *words):
    with pytest.raises(grpc.RpcError) as info:
        run_generate(endpoint, request)
    assert info.value.code() == code, info.value
    for word in words:
        assert word in info.value.details(), info.value.details()


def test_bad_input_status_codes(endpoint):
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    expect_error(endpoint, chat_request("x", temperature=-1.0), invalid, "temperature")
    expect_error(endpoint, chat_request("x", top_p=0.0), invalid, "top_p")
    expect_error(endpoint, chat_request("x", max_tokens=10**9), invalid, "maximum context length")
    expect_error(endpoint, pb.GenerateRequest(model=MODEL_NAME), invalid, "text", "chat")
    expect_error(endpoint, pb.GenerateRequest(model=MODEL_NAME, token_ids=pb.TokenIds(
        ids=[1, 10**8])), invalid, "token id")
    expect_error(endpoint, pb.GenerateRequest(model=MODEL_NAME, chat=pb.ChatPrompt()), invalid,
                 "messages")
    unknown = chat_request("x")
    unknown.model = "no-such-model"
    expect_error(endpoint, unknown, grpc.StatusCode.NOT_FOUND, "no-such-model")
    with pytest.raises(grpc.RpcError) as info:
        endpoint.stub.Tokenize(pb.TokenizeRequest(), timeout=RPC_TIMEOUT_S)
    assert info.value.code() == invalid


def test_cancel_mid_stream_frees_kv_blocks(endpoint):
    request = chat_request("Count to a thousand.", max_tokens=2000, ignore_eos=True)
    call = endpoint.stub.Generate(request, timeout=RPC_TIMEOUT_S)
    received = 0
    for message in call:
        received += len(message.tokens)
        if received >= 4:
            break
    wait_until(lambda: endpoint.metric("sluice_kv_cache_free_blocks") <
               endpoint.metric("sluice_kv_cache_blocks"), 10, "blocks in use while streaming")
    call.cancel()
    with pytest.raises(grpc.RpcError) as info:
        for _ in call:
            pass
    assert info.value.code() == grpc.StatusCode.CANCELLED
    # The request was aborted (not decoded to the end): its blocks return to free promptly.
    wait_until(lambda: endpoint.metric("sluice_kv_cache_free_blocks") ==
               endpoint.metric("sluice_kv_cache_blocks"), 15, "KV blocks back to free")


# Tools and structured output (issue 24): the same validation and output as the HTTP API.
WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 10}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET", "PST"]}},
        "required": ["zone"]}
HTTP_TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
                                                "parameters": WEATHER}},
              {"type": "function", "function": {"name": "get_time", "parameters": TIME}}]
GRPC_TOOLS = [pb.Tool(name="get_weather", description="Weather",
                      parameters_json=json.dumps(WEATHER)),
              pb.Tool(name="get_time", parameters_json=json.dumps(TIME))]


def tool_request(content, **fields):
    request = chat_request(content, max_tokens=200)
    request.tools.extend(GRPC_TOOLS)
    for name, value in fields.items():
        if name == "tool_choice":
            request.tool_choice.CopyFrom(value)
        else:
            setattr(request, name, value)
    return request


def run_tool_generate(endpoint, request):
    """Returns (text, finish reason name, tool calls) of a Generate stream."""
    text, finish, calls = "", None, []
    for message in endpoint.stub.Generate(request, timeout=RPC_TIMEOUT_S):
        text += message.text
        calls.extend(message.tool_calls)
        if message.finish_reason:
            finish = common.FinishReason.Name(message.finish_reason)
    return text, finish, calls


@pytest.mark.parametrize("choice", ["required", "get_time"])
def test_tool_choice_generate_equals_http(endpoint, choice):
    content = "What is the time in Oslo?"
    http_choice = (choice if choice == "required"
                   else {"type": "function", "function": {"name": choice}})
    http = endpoint.http.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": content}], temperature=0,
        max_tokens=200, tools=HTTP_TOOLS, tool_choice=http_choice, parallel_tool_calls=False)
    grpc_choice = (pb.ToolChoice(mode="required") if choice == "required"
                   else pb.ToolChoice(function=choice))
    text, finish, calls = run_tool_generate(
        endpoint, tool_request(content, tool_choice=grpc_choice, parallel_tool_calls=False))
    message = http.choices[0].message
    assert http.choices[0].finish_reason == "tool_calls"
    assert finish == "FINISH_REASON_TOOL_CALLS"
    assert [(c.name, c.arguments) for c in calls] == [
        (c.function.name, c.function.arguments) for c in message.tool_calls]
    assert all(c.id.startswith("call_") and len(c.id) == 29 for c in calls)
    # The raw text holds the call in the template's syntax (hermes).
    assert text.startswith("<tool_call>"), text
    if choice != "required":
        assert [c.name for c in calls] == [choice]
    # The call goes back through the template on the next turn, as on HTTP.
    follow = chat_request("", max_tokens=8)
    follow.chat.messages[0].content = content
    follow.chat.messages.append(pb.ChatMessage(role="assistant", tool_calls=calls))
    follow.chat.messages.append(pb.ChatMessage(role="tool", tool_call_id=calls[0].id,
                                               content='{"zone": "CET"}'))
    follow.tools.extend(GRPC_TOOLS)
    http_follow = endpoint.http.chat.completions.create(
        model=MODEL_NAME, temperature=0, max_tokens=8, tools=HTTP_TOOLS, messages=[
            {"role": "user", "content": content},
            {"role": "assistant", "tool_calls": [
                {"id": c.id, "type": "function",
                 "function": {"name": c.name, "arguments": c.arguments}} for c in calls]},
            {"role": "tool", "tool_call_id": calls[0].id, "content": '{"zone": "CET"}'}])
    follow_text, _, _, usage = run_generate(endpoint, follow)
    assert usage.prompt_tokens == http_follow.usage.prompt_tokens
    assert follow_text == (http_follow.choices[0].message.content or "")


def test_response_format_generate_equals_http(endpoint):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                               "age": {"type": "integer", "minimum": 0,
                                                       "maximum": 120}},
              "required": ["name", "age"], "additionalProperties": False}
    content = "Describe a person as JSON."
    http = endpoint.http.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": content}], temperature=0,
        max_tokens=60, response_format={"type": "json_schema", "json_schema": {
            "name": "person", "schema": schema, "strict": True}})
    request = chat_request(content, max_tokens=60)
    request.response_format.CopyFrom(pb.ResponseFormat(
        type="json_schema", name="person", schema_json=json.dumps(schema), strict=True))
    text, _, finish, _ = run_generate(endpoint, request)
    assert text == http.choices[0].message.content
    assert finish == "FINISH_REASON_STOP"
    value = json.loads(text)
    assert set(value) == {"name", "age"}
    # On a text prompt, as /v1/completions.
    digit = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0,
                                                    "maximum": 9}},
             "required": ["a"], "additionalProperties": False}
    http = endpoint.http.completions.create(
        model=MODEL_NAME, prompt="JSON:", temperature=0, max_tokens=30,
        extra_body={"response_format": {"type": "json_schema",
                                        "json_schema": {"name": "d", "schema": digit}}})
    request = pb.GenerateRequest(model=MODEL_NAME, text="JSON:", detokenize=True,
                                 sampling=common.SamplingParams(temperature=0.0, max_tokens=30),
                                 response_format=pb.ResponseFormat(
                                     type="json_schema", name="d", schema_json=json.dumps(digit)))
    text, _, finish, _ = run_generate(endpoint, request)
    assert finish == "FINISH_REASON_STOP"
    assert text == http.choices[0].text
    assert 0 <= json.loads(text)["a"] <= 9


def http_error(endpoint, **body):
    with pytest.raises(openai.BadRequestError) as info:
        endpoint.http.chat.completions.create(
            model=MODEL_NAME, messages=[{"role": "user", "content": "x"}], max_tokens=4, **body)
    return info.value.body["message"]


def test_tool_and_response_format_errors_are_the_http_ones(endpoint):
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    cases = [
        (dict(tools=HTTP_TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}),
         tool_request("x", tool_choice=pb.ToolChoice(function="nope"))),
        (dict(tools=HTTP_TOOLS, tool_choice="sometimes"),
         tool_request("x", tool_choice=pb.ToolChoice(mode="sometimes"))),
        (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "patternProperties": {"a": {}}}}}]),
         pb.GenerateRequest(model=MODEL_NAME, chat=chat_request("x").chat, tools=[pb.Tool(
             name="f", parameters_json='{"type": "object", "patternProperties": {"a": {}}}')])),
        (dict(response_format={"type": "json_schema", "json_schema": {
            "name": "e", "schema": {"enum": []}}}),
         pb.GenerateRequest(model=MODEL_NAME, chat=chat_request("x").chat,
                            response_format=pb.ResponseFormat(type="json_schema", name="e",
                                                              schema_json='{"enum": []}'))),
        # The schema is an object: JSON text of a string is refused as HTTP refuses a string.
        (dict(response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": "{}"}}),
         pb.GenerateRequest(model=MODEL_NAME, chat=chat_request("x").chat,
                            response_format=pb.ResponseFormat(type="json_schema", name="s",
                                                              schema_json='"{}"'))),
        (dict(response_format={"type": "xml"}),
         pb.GenerateRequest(model=MODEL_NAME, chat=chat_request("x").chat,
                            response_format=pb.ResponseFormat(type="xml"))),
    ]
    for http_body, request in cases:
        message = http_error(endpoint, **http_body)
        with pytest.raises(grpc.RpcError) as info:
            run_generate(endpoint, request)
        assert info.value.code() == invalid, info.value
        assert info.value.details() == message
    # gRPC's own shapes.
    expect_error(endpoint, pb.GenerateRequest(model=MODEL_NAME, chat=chat_request("x").chat,
                                              tools=[pb.Tool(name="f", parameters_json="{")]),
                 invalid, "tools[0].parameters_json is not valid JSON")
    expect_error(endpoint, pb.GenerateRequest(model=MODEL_NAME, text="x", tools=GRPC_TOOLS),
                 invalid, "tools, tool_choice and parallel_tool_calls need a chat prompt")
    expect_error(endpoint, pb.GenerateRequest(model=MODEL_NAME, text="x",
                                              response_format=pb.ResponseFormat(
                                                  type="json_object", schema_json="{}")),
                 invalid, "response_format.name, schema_json, strict and description are only "
                          "valid with type 'json_schema', got type 'json_object'")


registry_pb, registry_grpc = modules("registry")


def test_router_refuses_constraints_without_a_grammar_capable_worker():
    """A worker from before grammars (no 'grammar' capability) would drop the grammar and
    answer unconstrained: the router refuses such requests instead, and routes them only to
    workers that advertise the capability."""
    log_dir = tempfile.mkdtemp(prefix="sluice-grpc-capability-")
    port, grpc_port = free_port(), free_port()
    proc = Proc("router", [sluice_bin(), "router", "--model", str(MODEL_DIR), "--port",
                           str(port), "--grpc-port", str(grpc_port)], log_dir)
    url = f"http://127.0.0.1:{port}"
    try:
        def up():
            try:
                return http_get(url + "/health")[0] == 200
            except urllib.error.HTTPError as e:  # 503 without workers: up all the same
                return e.code == 503

        wait_until(up, STARTUP_TIMEOUT_S, "router /health")
        registry = registry_grpc.RegistryStub(grpc.insecure_channel(f"127.0.0.1:{grpc_port}"))

        def register(capabilities):
            # Nothing listens there: a request routed to it fails fast.
            info = registry_pb.WorkerInfo(role=registry_pb.WORKER_ROLE_DECODE,
                                          address=f"127.0.0.1:{free_port()}", model=MODEL_NAME,
                                          kv_block_size=16, num_total_blocks=1000,
                                          max_model_len=2048, capabilities=capabilities)
            registry.Register(registry_pb.RegisterRequest(worker=info), timeout=RPC_TIMEOUT_S)

        register([])
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", timeout=RPC_TIMEOUT_S,
                               max_retries=0)
        refused = ("no decode worker registered with the router can enforce structured outputs "
                   "or tool_choice \"required\"/named (none advertises the 'grammar' capability: "
                   "upgrade the workers to this router's version)")
        for body in (dict(response_format={"type": "json_object"}),
                     dict(tools=HTTP_TOOLS, tool_choice="required")):
            with pytest.raises(openai.APIStatusError) as info:
                client.chat.completions.create(
                    model=MODEL_NAME, messages=[{"role": "user", "content": "x"}],
                    max_tokens=4, **body)
            assert info.value.status_code == 503
            assert info.value.body["message"] == refused
        stub = pb_grpc.InferenceStub(grpc.insecure_channel(f"127.0.0.1:{grpc_port}"))
        request = chat_request("x", max_tokens=4)
        request.response_format.CopyFrom(pb.ResponseFormat(type="json_object"))
        with pytest.raises(grpc.RpcError) as info:
            for _ in stub.Generate(request, timeout=RPC_TIMEOUT_S):
                pass
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert info.value.details() == refused
        # With a capable worker the request is routed there (and fails: nothing listens), never
        # to the old one; the refusal is gone.
        register(["grammar"])
        with pytest.raises(openai.APIStatusError) as info:
            client.chat.completions.create(
                model=MODEL_NAME, messages=[{"role": "user", "content": "x"}], max_tokens=4,
                response_format={"type": "json_object"})
        assert info.value.body["message"] != refused
    finally:
        proc.stop()
