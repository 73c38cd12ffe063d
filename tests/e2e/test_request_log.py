"""The request log of `sluice serve`: one line per generation request with the request's
`user` (OpenAI metadata: logged, no effect on the output), JSON-quoted so a client cannot forge
lines; refused requests are logged with it too."""

import time
import uuid

import openai
import pytest


def log_lines(server, needle, timeout=10.0):
    """The server log lines holding `needle` (the line is written when the request ends, on the
    server's executor: it may trail the response a moment)."""
    deadline = time.monotonic() + timeout
    while True:
        lines = [l for l in server.logs().splitlines() if needle in l]
        if lines or time.monotonic() > deadline:
            return lines
        time.sleep(0.1)


def test_user_is_logged_per_request(server, client, model):
    user = f"u-{uuid.uuid4().hex[:8]}"
    chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}],
                                          max_tokens=3, temperature=0, user=user)
    lines = log_lines(server, f'user="{user}"')
    assert len(lines) == 1, lines
    line = lines[0]
    assert f"POST /v1/chat/completions 200 id={chat.id} " in line
    assert f"prompt_tokens={chat.usage.prompt_tokens} " in line
    assert f"completion_tokens={chat.usage.completion_tokens} " in line
    assert f"finish={chat.choices[0].finish_reason} " in line

    r = client.responses.create(model=model, input="Hi", max_output_tokens=2, user=user + "-r")
    [line] = log_lines(server, f'user="{user}-r"')
    assert f"POST /v1/responses 200 id={r.id} " in line
    c = client.completions.create(model=model, prompt="Ge1:1", max_tokens=2, user=user + "-c",
                                  stream=True, extra_body={"ignore_eos": True})
    list(c)
    [line] = log_lines(server, f'user="{user}-c"')
    assert "POST /v1/completions 200 " in line and "finish=length" in line


def test_refused_request_and_forged_lines(server, client, model):
    tag = uuid.uuid4().hex[:8]
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}],
                                       max_tokens=3, temperature=-1, user=f"bad-{tag}")
    [line] = log_lines(server, f'user="bad-{tag}"')
    assert "POST /v1/chat/completions 400 " in line and "error=" in line
    forged = f"x-{tag}\nPOST /v1/chat/completions 200 user=\"admin\""
    client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}],
                                   max_tokens=1, user=forged)
    [line] = log_lines(server, f'x-{tag}')
    assert f'user="x-{tag}\\nPOST /v1/chat/completions 200 user=\\"admin\\""' in line
    assert not [l for l in server.logs().splitlines() if l.startswith("POST /v1/chat")]
