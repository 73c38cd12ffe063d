"""Every documented field of /v1/chat/completions and /v1/completions is honoured (a value that
changes the output changes it as it should) or refused (400 naming it), and the server keeps
serving after each refusal. The field lists are read from services/api/openai_fields.cc, so a
field added there without a check here fails test_every_table_field_is_swept."""

import json
import pathlib
import re
import urllib.error
import urllib.request

import openai
import pytest
import tokenizers

REPO = pathlib.Path(__file__).resolve().parents[2]
MODEL_DIR = REPO / "models" / "sluice-mini-moe"
CHAT_GOLDEN = json.loads((REPO.parent / "shared" / "fixtures" / "tokenizer" /
                          "chat_golden.json").read_text())
PROMPT = "Ge1:1 In the beginning"
CHAT = [{"role": "user", "content": "Who made the heaven and the earth?"}]


def table_fields():
    """{endpoint: set of field names} from the C++ field tables."""
    src = (REPO / "services" / "api" / "openai_fields.cc").read_text()

    def body(fn):
        start = src.index(fn)
        end = src.index("\n}\n", start)
        return set(re.findall(r'"([a-z_]+)"', src[start:end]))

    shared = body("void AddSharedFields(")
    return {"chat": shared | body("std::vector<FieldSpec> ChatFields()"),
            "completions": shared | body("std::vector<FieldSpec> CompletionFields()"),
            "responses": body("std::vector<FieldSpec> ResponsesFields()")}


@pytest.fixture(scope="module")
def tok():
    return tokenizers.Tokenizer.from_file(str(MODEL_DIR / "tokenizer.json"))


def post(base_url, path, body):
    """POSTs JSON; returns (status, parsed body)."""
    req = urllib.request.Request(base_url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def completion_ids(client, model, **kw):
    """Greedy completion; returns (token ids, response)."""
    extra = kw.pop("extra_body", {})
    extra.update({"return_tokens_as_token_ids": True, "skip_special_tokens": False})
    r = client.completions.create(model=model, prompt=kw.pop("prompt", PROMPT),
                                  max_tokens=kw.pop("max_tokens", 24), temperature=0, logprobs=0,
                                  extra_body=extra, **kw)
    return [int(t.split(":", 1)[1]) for t in r.choices[0].logprobs.tokens], r


# ---- refused fields: (endpoint, field, value) ----
REFUSED = [
    ("chat", "functions", [{"name": "f"}]),
    ("chat", "function_call", "auto"),
    ("chat", "prediction", {"type": "content", "content": "x"}),
    ("chat", "audio", {"voice": "alloy", "format": "wav"}),
    ("chat", "modalities", ["text", "audio"]),
    ("chat", "web_search_options", {}),
    ("chat", "reasoning_effort", "low"),
    ("chat", "verbosity", "low"),
    ("chat", "mm_processor_kwargs", {"x": 1}),
    ("completions", "suffix", "tail"),
    ("completions", "prompt_embeds", "AAAA"),
]
for _ep in ("chat", "completions"):
    REFUSED += [
        (_ep, "use_beam_search", True),
        (_ep, "length_penalty", 0.5),
        (_ep, "early_stopping", True),
        (_ep, "spaces_between_special_tokens", False),
        (_ep, "guided_decoding_backend", "xgrammar"),
        (_ep, "guided_whitespace_pattern", " "),
        (_ep, "logits_processors", ["x"]),
        (_ep, "kv_transfer_params", {"do_remote_decode": True}),
        (_ep, "vllm_xargs", {"x": 1}),
        (_ep, "return_token_ids", True),
        (_ep, "frobnicate", 1),  # unknown
    ]
# Fields accepted as metadata (no effect on the output) and their endpoints.
METADATA = {
    "chat": {"user": "u1", "request_id": "r-1", "metadata": {"k": "v"}, "store": True,
             "service_tier": "auto", "prompt_cache_key": "k", "safety_identifier": "s"},
    "completions": {"user": "u1", "request_id": "r-1"},
}
# Honoured fields, each checked by a test below (or by test_openai_api.py /
# test_greedy_reference.py for the long-standing ones).
HONOURED = {
    "model", "n", "best_of", "temperature", "top_p", "top_k", "min_p", "presence_penalty",
    "frequency_penalty", "repetition_penalty", "seed", "stop", "stop_token_ids", "max_tokens",
    "min_tokens", "ignore_eos", "stream", "stream_options", "skip_special_tokens",
    "include_stop_str_in_output", "logprobs", "cache_salt", "logit_bias", "allowed_token_ids",
    "bad_words", "truncate_prompt_tokens", "prompt_logprobs", "echo", "add_special_tokens",
    "return_tokens_as_token_ids", "messages", "max_completion_tokens", "top_logprobs",
    "add_generation_prompt", "continue_final_message", "chat_template", "chat_template_kwargs",
    "documents", "prompt",
    # Structured outputs: tests/e2e/test_structured_outputs.py.
    "response_format", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
    "structured_outputs",
    # Tool calling: tests/e2e/test_tool_calls.py.
    "tools", "tool_choice", "parallel_tool_calls",
    # Scheduling class: tests/e2e/test_fair_prefill.py.
    "priority",
}


def test_every_table_field_is_swept():
    tables = table_fields()
    for ep in ("chat", "completions"):
        swept = ({f for e, f, _ in REFUSED if e == ep} | set(METADATA[ep]) | HONOURED)
        missing = tables[ep] - swept
        assert not missing, f"{ep} fields without a check: {sorted(missing)}"


def body_for(ep, model, field, value):
    body = {"model": model, "max_tokens": 4, field: value}
    if ep == "chat":
        body["messages"] = CHAT
    else:
        body["prompt"] = PROMPT
    return body


@pytest.mark.parametrize("ep,field,value", REFUSED, ids=[f"{e}-{f}" for e, f, _ in REFUSED])
def test_refused_field_is_400_naming_it_and_server_goes_on(base_url, model, ep, field, value):
    path = "/v1/chat/completions" if ep == "chat" else "/v1/completions"
    status, body = post(base_url, path, body_for(ep, model, field, value))
    assert status == 400, body
    assert body["error"]["param"] == field
    assert field in body["error"]["message"]
    status, body = post(base_url, path, body_for(ep, model, "temperature", 0))
    assert status == 200, body


@pytest.mark.parametrize("ep", ["chat", "completions"])
def test_metadata_fields_are_accepted_without_effect(base_url, model, ep):
    path = "/v1/chat/completions" if ep == "chat" else "/v1/completions"
    plain = body_for(ep, model, "temperature", 0)
    status, want = post(base_url, path, plain)
    assert status == 200
    status, got = post(base_url, path, {**plain, **METADATA[ep]})
    assert status == 200, got
    text = (lambda r: r["choices"][0]["message"]["content"]) if ep == "chat" else (
        lambda r: r["choices"][0]["text"])
    assert text(got) == text(want)


def test_metadata_is_refused_on_completions(base_url, model):
    status, body = post(base_url, "/v1/completions",
                        body_for("completions", model, "metadata", {"k": "v"}))
    assert status == 400 and body["error"]["param"] == "metadata"


# ---- honoured fields ----

def test_bad_words_removes_the_word(client, model, tok):
    prompt = "Psa23:1 The LORD is my shepherd"
    ids, r = completion_ids(client, model, prompt=prompt, max_tokens=32)
    the = tok.token_to_id("Ġthe")
    assert the in ids and " the LORD" in r.choices[0].text  # the reference uses the word
    banned = [tok.encode(w, add_special_tokens=False).ids for w in ("the", " the")]
    got, r2 = completion_ids(client, model, prompt=prompt, max_tokens=32,
                             extra_body={"bad_words": ["the"]})
    assert got != ids
    for word in banned:
        n = len(word)
        assert all(got[i:i + n] != word for i in range(len(got) - n + 1)), (word, got)
    assert " the LORD" not in r2.choices[0].text
    # Chat too.
    r3 = client.chat.completions.create(model=model, max_tokens=32, temperature=0,
                                        messages=[{"role": "user", "content": prompt}],
                                        extra_body={"bad_words": ["the"]})
    assert " the " not in r3.choices[0].message.content


def test_bad_words_multi_token(client, model, tok):
    ids, r = completion_ids(client, model, prompt="Ge1:3 And God said", max_tokens=32)
    # A two-token word of the reference output: banned as a sequence, its first token stays.
    word_ids = ids[2:4]
    word = tok.decode(word_ids)
    got, _ = completion_ids(client, model, prompt="Ge1:3 And God said", max_tokens=32,
                            extra_body={"bad_words": [word]})
    banned = tok.encode(word.lstrip(), add_special_tokens=False).ids
    n = len(banned)
    assert all(got[i:i + n] != banned for i in range(len(got) - n + 1))
    assert got != ids


def test_allowed_token_ids_restrict_every_token(client, model, tok):
    allowed = [tok.token_to_id(t) for t in ("ĠLORD", "Ġand", "Ġthe", ",")]
    assert None not in allowed
    got, _ = completion_ids(client, model, max_tokens=16,
                            extra_body={"allowed_token_ids": allowed, "ignore_eos": True})
    assert len(got) == 16 and set(got) <= set(allowed)


def test_logit_bias_bans_and_forces(client, model):
    ids, _ = completion_ids(client, model, max_tokens=8)
    banned, _ = completion_ids(client, model, max_tokens=8, logit_bias={str(ids[0]): -100})
    assert banned[0] != ids[0] and ids[0] not in banned
    forced, _ = completion_ids(client, model, max_tokens=8, logit_bias={"300": 100},
                               extra_body={"ignore_eos": True})
    assert forced == [300] * 8
    # Chat too.
    r = client.chat.completions.create(model=model, messages=CHAT, max_tokens=4, temperature=0,
                                       logit_bias={"300": 100})
    assert r.usage.completion_tokens == 4


def test_truncate_prompt_tokens_changes_prompt_tokens(client, model):
    _, full = completion_ids(client, model)
    _, cut = completion_ids(client, model, extra_body={"truncate_prompt_tokens": 3})
    assert full.usage.prompt_tokens > 3 and cut.usage.prompt_tokens == 3
    r = client.chat.completions.create(model=model, messages=CHAT, max_tokens=2,
                                       extra_body={"truncate_prompt_tokens": 5})
    assert r.usage.prompt_tokens == 5


def test_top_k_and_min_p_on_both_endpoints(client, model):
    greedy, _ = completion_ids(client, model)
    # top_k=1 / min_p=1 keep only the most likely token: sampling equals greedy.
    for extra in ({"top_k": 1}, {"min_p": 1.0}):
        r = client.completions.create(model=model, prompt=PROMPT, max_tokens=24, temperature=1.0,
                                      seed=7, logprobs=0,
                                      extra_body={**extra, "return_tokens_as_token_ids": True,
                                                  "skip_special_tokens": False})
        assert [int(t.split(":")[1]) for t in r.choices[0].logprobs.tokens] == greedy
    want = client.chat.completions.create(model=model, messages=CHAT, max_tokens=12,
                                          temperature=0).choices[0].message.content
    for extra in ({"top_k": 1}, {"min_p": 1.0}):
        got = client.chat.completions.create(model=model, messages=CHAT, max_tokens=12,
                                             temperature=1.0, seed=3, extra_body=extra)
        assert got.choices[0].message.content == want


@pytest.mark.parametrize("ep", ["chat", "completions"])
def test_continuous_usage_stats(client, model, ep):
    kw = dict(model=model, max_tokens=10, temperature=0, stream=True, n=2,
              stream_options={"include_usage": True,
                              "continuous_usage_stats": True})  # type: ignore[typeddict-item]
    if ep == "chat":
        chunks = list(client.chat.completions.create(messages=CHAT, **kw))
    else:
        chunks = list(client.completions.create(prompt=PROMPT, **kw))
    assert len(chunks) > 4
    assert all(c.usage is not None for c in chunks)
    last = chunks[-1]
    assert last.choices == []
    prompt = last.usage.prompt_tokens
    # Running completion counts never decrease and end at the final total.
    counts = [c.usage.completion_tokens for c in chunks]
    assert counts == sorted(counts)
    assert all(c.usage.prompt_tokens == prompt for c in chunks)
    assert all(c.usage.total_tokens == c.usage.prompt_tokens + c.usage.completion_tokens
               for c in chunks)
    assert counts[-2] == counts[-1] == last.usage.completion_tokens <= 20
    if ep == "completions":
        text = {0: "", 1: ""}
        for c in chunks:
            for ch in c.choices:
                text[ch.index] += ch.text
        full = client.completions.create(model=model, prompt=PROMPT, max_tokens=10,
                                         temperature=0, n=2)
        assert full.usage.completion_tokens == last.usage.completion_tokens
        assert [text[0], text[1]] == [ch.text for ch in full.choices]


def golden_text(conv, gen):
    return conv["with_generation_prompt" if gen else "without_generation_prompt"]


@pytest.mark.parametrize("conv", [c for c in CHAT_GOLDEN["conversations"] if "error" not in c][:4],
                         ids=lambda c: c["name"])
def test_chat_template_string_renders_like_transformers(client, model, conv):
    """The golden template as a request chat_template: the prompt is the ids transformers
    renders, so the output equals a completion of those ids."""
    want = golden_text(conv, True)["ids"]
    r = client.chat.completions.create(model=model, messages=conv["messages"], max_tokens=8,
                                       temperature=0,
                                       extra_body={"chat_template": CHAT_GOLDEN["chat_template"]})
    assert r.usage.prompt_tokens == len(want)
    c = client.completions.create(model=model, prompt=want, max_tokens=8, temperature=0)
    assert r.choices[0].message.content == c.choices[0].text


def test_chat_template_changes_prompt_and_kwargs_reach_it(client, model, tok):
    template = ("{{ bos_token }}{% if enable_thinking is defined and enable_thinking %}"
                "<|system|>\nThink.{{ eos_token }}\n"
                "{% endif %}{% for m in messages %}{{ m['content'] }}{% endfor %}")
    base = client.chat.completions.create(model=model, messages=CHAT, max_tokens=4,
                                          temperature=0)
    plain = client.chat.completions.create(model=model, messages=CHAT, max_tokens=4,
                                           temperature=0, extra_body={"chat_template": template})
    want = tok.encode("<|begin_of_text|>" + CHAT[0]["content"], add_special_tokens=False).ids
    assert plain.usage.prompt_tokens == len(want) != base.usage.prompt_tokens
    think = client.chat.completions.create(
        model=model, messages=CHAT, max_tokens=4, temperature=0,
        extra_body={"chat_template": template,
                    "chat_template_kwargs": {"enable_thinking": True}})
    want = tok.encode("<|begin_of_text|><|system|>\nThink.<|end_of_text|>\n" +
                      CHAT[0]["content"], add_special_tokens=False).ids
    assert think.usage.prompt_tokens == len(want)


def test_continue_final_message_and_chat_echo(client, model, tok):
    partial = "In the beginning God"
    messages = CHAT + [{"role": "assistant", "content": partial}]
    r = client.chat.completions.create(
        model=model, messages=messages, max_tokens=10, temperature=0,
        extra_body={"continue_final_message": True, "add_generation_prompt": False,
                    "echo": True})
    text = ("<|begin_of_text|><|user|>\n" + CHAT[0]["content"] + "<|end_of_text|>\n"
            "<|assistant|>\n" + partial)
    ids = tok.encode(text, add_special_tokens=False).ids
    assert r.usage.prompt_tokens == len(ids)
    c = client.completions.create(model=model, prompt=ids, max_tokens=10, temperature=0)
    assert r.choices[0].message.content == partial + c.choices[0].text
    # Streamed: the echo comes first.
    chunks = list(client.chat.completions.create(
        model=model, messages=messages, max_tokens=10, temperature=0, stream=True,
        extra_body={"continue_final_message": True, "add_generation_prompt": False,
                    "echo": True}))
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == \
        partial + c.choices[0].text


def test_add_special_tokens(client, model):
    with_bos = client.completions.create(model=model, prompt=PROMPT, max_tokens=1)
    without = client.completions.create(model=model, prompt=PROMPT, max_tokens=1,
                                        extra_body={"add_special_tokens": False})
    assert without.usage.prompt_tokens == with_bos.usage.prompt_tokens - 1


def test_documents_reach_the_template(client, model):
    template = ("{% if documents %}{% for d in documents %}{{ d['text'] }}{% endfor %}{% endif %}"
                "{{ messages[0]['content'] }}")
    a = client.chat.completions.create(model=model, messages=CHAT, max_tokens=1,
                                       extra_body={"chat_template": template})
    b = client.chat.completions.create(model=model, messages=CHAT, max_tokens=1,
                                       extra_body={"chat_template": template,
                                                   "documents": [{"text": "Ge1:1 In the"}]})
    assert b.usage.prompt_tokens > a.usage.prompt_tokens


def test_allow_unknown_fields_flag():
    from conftest import MODEL_NAME, ServerProcess
    server = ServerProcess(["--allow-unknown-fields"])
    try:
        status, body = post(server.url, "/v1/completions",
                            {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 2,
                             "frobnicate": 1})
        assert status == 200, body
        # Refused fields stay refused.
        status, body = post(server.url, "/v1/completions",
                            {"model": MODEL_NAME, "prompt": PROMPT, "use_beam_search": True})
        assert status == 400 and body["error"]["param"] == "use_beam_search"
        assert "ignoring unknown request fields: frobnicate" in server.logs()
    finally:
        assert server.stop() == 0


def test_unknown_field_error_is_openai_shaped(client, model):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, messages=CHAT, extra_body={"frob": 1})
    assert e.value.body["param"] == "frob"
    assert e.value.body["message"] == "Unrecognized request argument supplied: frob"
