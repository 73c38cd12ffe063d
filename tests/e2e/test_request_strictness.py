"""Request shapes a vLLM/OpenAI server refuses are refused here too, with an OpenAI-style 400
naming the field, and the server goes on serving: messages without content, unknown keys inside
messages / response_format / Responses input items, an empty Responses input,
truncate_prompt_tokens beyond the context. Also: message keys that reach the template, the seed
on /v1/responses."""

import json
import pathlib
import urllib.error
import urllib.request

import pytest
import tokenizers

REPO = pathlib.Path(__file__).resolve().parents[2]
MODEL_DIR = REPO / "models" / "sluice-mini-moe"
CHAT = [{"role": "user", "content": "Who made the heaven and the earth?"}]


def post(base_url, path, body):
    req = urllib.request.Request(base_url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def max_model_len(base_url, model):
    with urllib.request.urlopen(f"{base_url}/v1/models/{model}", timeout=60) as r:
        return json.loads(r.read())["max_model_len"]


def refused(base_url, model, path, body, param, message):
    """Asserts a 400 naming `param` with `message`, then that the server still answers."""
    status, reply = post(base_url, path, dict(body, model=model))
    assert status == 400, reply
    error = reply["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error", error
    assert error["message"] == message, error
    status, reply = post(base_url, "/v1/chat/completions",
                         {"model": model, "messages": CHAT, "max_tokens": 2})
    assert status == 200, reply


@pytest.mark.parametrize("messages,message", [
    ([{"role": "user"}], "messages[0].content is required for a 'user' message"),
    ([{"role": "user", "content": None}], "messages[0].content is required for a 'user' message"),
    ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
      {"role": "assistant"}], "messages[2].content is required for a 'assistant' message"),
])
def test_message_without_content_is_400(base_url, model, messages, message):
    refused(base_url, model, "/v1/chat/completions", {"messages": messages, "max_tokens": 2},
            "messages", message)


def test_unknown_message_key_is_400(base_url, model):
    refused(base_url, model, "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "Hi", "contents": "typo"}],
             "max_tokens": 2},
            "messages", "Unrecognized request argument supplied: messages[0].contents")


@pytest.mark.parametrize("response_format,message", [
    ({"type": "json_object", "schema": {"type": "object"}},
     "Unrecognized request argument supplied: response_format.schema"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"},
                                             "stirct": True}},
     "Unrecognized request argument supplied: response_format.json_schema.stirct"),
])
def test_unknown_response_format_key_is_400(base_url, model, response_format, message):
    refused(base_url, model, "/v1/chat/completions",
            {"messages": CHAT, "max_tokens": 2, "response_format": response_format},
            "response_format", message)


@pytest.mark.parametrize("value,message", [
    ("", "'input' must not be an empty string"),
    ([], "'input' must be a string or a non-empty list of messages"),
    ([{"role": "user", "content": "Hi", "colour": "red"}],
     "Unrecognized request argument supplied: input[0].colour"),
])
def test_bad_responses_input_is_400(base_url, model, value, message):
    refused(base_url, model, "/v1/responses", {"input": value}, "input", message)


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"prompt": "Ge1:1 In the beginning", "max_tokens": 2}),
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 2}),
])
def test_truncate_prompt_tokens_beyond_context_is_400(base_url, model, path, body):
    limit = max_model_len(base_url, model)
    refused(base_url, model, path, dict(body, truncate_prompt_tokens=limit + 1),
            "truncate_prompt_tokens",
            f"'truncate_prompt_tokens' must be at most the model's context length ({limit}), "
            f"got {limit + 1}")
    status, reply = post(base_url, path, dict(body, model=model, truncate_prompt_tokens=limit))
    assert status == 200, reply


def test_message_keys_reach_the_template(base_url, model):
    tok = tokenizers.Tokenizer.from_file(str(MODEL_DIR / "tokenizer.json"))
    template = ("{% for m in messages %}{{ m.role }}:{{ m.tool_call_id }}:{{ m.reasoning_content }}"
                ":{{ m.content }};{% endfor %}")
    messages = [{"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": "It is", "reasoning_content": "think"},
                {"role": "tool", "content": "sunny", "tool_call_id": "call_7"}]
    status, reply = post(base_url, "/v1/chat/completions",
                         {"model": model, "messages": messages, "max_tokens": 1,
                          "chat_template": template})
    assert status == 200, reply
    text = "user:::Weather?;assistant::think:It is;tool:call_7::sunny;"
    assert reply["usage"]["prompt_tokens"] == len(tok.encode(text, add_special_tokens=False).ids)


def test_responses_report_the_seed(base_url, model):
    status, reply = post(base_url, "/v1/responses",
                         {"model": model, "input": "In the beginning", "max_output_tokens": 4,
                          "seed": 1234})
    assert status == 200, reply
    assert reply["seed"] == 1234
    status, unseeded = post(base_url, "/v1/responses",
                            {"model": model, "input": "In the beginning", "max_output_tokens": 4,
                             "temperature": 1.0})
    assert status == 200 and isinstance(unseeded["seed"], int), unseeded
    # The reported seed reproduces the sampled text.
    status, again = post(base_url, "/v1/responses",
                         {"model": model, "input": "In the beginning", "max_output_tokens": 4,
                          "temperature": 1.0, "seed": unseeded["seed"]})
    assert status == 200
    assert again["output"][0]["content"][0]["text"] == \
        unseeded["output"][0]["content"][0]["text"]
