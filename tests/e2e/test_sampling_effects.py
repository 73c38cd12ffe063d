"""Each sampling field has its effect, not only a 200: every test compares a greedy (or seeded)
run with the field against the same run without it on `sluice serve` (embedded model) and
asserts what the field must change, exactly:
- repetition_penalty / presence_penalty / frequency_penalty > 0 only demote tokens already seen
  (prompt + output for repetition, output for the others), so the greedy continuation first
  leaves the plain one at a token the plain one repeated, and repeats less; a negative
  frequency_penalty first leaves it for a token already in the output;
- stop_token_ids ends at that id (finish_reason "stop", the id not in the text);
- min_tokens holds EOS and stop ids off until that many tokens, even when forced;
- best_of > n returns the n of best_of candidates with the highest cumulative logprob;
- max_completion_tokens bounds the output and wins over max_tokens.
Token ids come back as "token_id:N" (return_tokens_as_token_ids)."""

import json
import urllib.error
import urllib.request

import pytest
import tokenizers

from conftest import MODEL_DIR

PROMPT = "Ge1:1 In the beginning God created the heaven and the earth."
EOS = 1  # models/sluice-mini-moe/generation_config.json


@pytest.fixture(scope="module")
def tok():
    return tokenizers.Tokenizer.from_file(str(MODEL_DIR / "tokenizer.json"))


def ids_of(choice):
    return [int(t.split(":", 1)[1]) for t in choice.logprobs.tokens]


def complete(client, model, max_tokens=48, **extra):
    """Greedy completion of PROMPT; returns (token ids, choice, response)."""
    body = {"return_tokens_as_token_ids": True, "skip_special_tokens": False}
    body.update(extra)
    r = client.completions.create(model=model, prompt=PROMPT, max_tokens=max_tokens,
                                  temperature=0, logprobs=0, extra_body=body)
    return ids_of(r.choices[0]), r.choices[0], r


def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None


def repeats(ids, before=()):
    """How many tokens of `ids` already occurred (in `before` or earlier in `ids`)."""
    seen, count = set(before), 0
    for t in ids:
        count += t in seen
        seen.add(t)
    return count


def test_plain_greedy_repeats_itself(client, model):
    # The premise of the penalty tests: without penalties the output repeats tokens.
    ids, _, _ = complete(client, model)
    assert repeats(ids) >= 8, ids


@pytest.mark.parametrize("field,value,over_prompt", [
    ("repetition_penalty", 1.5, True),
    ("presence_penalty", 1.5, False),
    ("frequency_penalty", 1.0, False),
])
def test_positive_penalty_demotes_seen_tokens(client, model, tok, field, value, over_prompt):
    plain, _, _ = complete(client, model)
    penalized, _, _ = complete(client, model, **{field: value})
    i = first_difference(plain, penalized)
    assert i is not None, f"{field}={value} changed nothing"
    # Unseen tokens keep their logits, seen ones lose: the greedy choice can only change where
    # the plain run picked a seen token.
    seen = set(plain[:i]) | (set(tok.encode(PROMPT).ids) if over_prompt else set())
    assert plain[i] in seen, (field, i, plain[i])
    assert penalized[i] != plain[i]
    prompt_ids = tok.encode(PROMPT).ids if over_prompt else ()
    assert repeats(penalized, prompt_ids) < repeats(plain, prompt_ids)


def test_negative_frequency_penalty_promotes_seen_tokens(client, model):
    plain, _, _ = complete(client, model)
    boosted, _, _ = complete(client, model, frequency_penalty=-1.5)
    i = first_difference(plain, boosted)
    assert i is not None
    # Only output tokens gain: the first change is to a token the output already had.
    assert boosted[i] in set(plain[:i]) and plain[i] != boosted[i]
    assert repeats(boosted) > repeats(plain)


def test_stop_token_ids_end_at_that_id(client, model):
    plain, _, _ = complete(client, model, max_tokens=32)
    # A token that first occurs at position k >= 3.
    k = next(k for k in range(3, len(plain)) if plain[k] not in plain[:k] and plain[k] != EOS)
    ids, choice, r = complete(client, model, max_tokens=32, stop_token_ids=[plain[k]])
    assert ids == plain[:k + 1]
    assert choice.finish_reason == "stop"
    assert r.usage.completion_tokens == k + 1
    # The stop id is not part of the text: it is the text of the first k tokens.
    _, first_k, _ = complete(client, model, max_tokens=k)
    assert choice.text == first_k.text
    # With include_stop_str_in_output the id's text is kept.
    _, kept, _ = complete(client, model, max_tokens=32, stop_token_ids=[plain[k]],
                          include_stop_str_in_output=True)
    _, first_k1, _ = complete(client, model, max_tokens=k + 1)
    assert kept.text == first_k1.text


def test_min_tokens_holds_eos_off(client, model):
    # logit_bias +100 on EOS forces it at once; min_tokens holds it off for that many tokens.
    force = {"logit_bias": {str(EOS): 100}}
    ids, choice, r = complete(client, model, **force)
    assert ids == [EOS] and choice.finish_reason == "stop" and r.usage.completion_tokens == 1
    ids, choice, r = complete(client, model, min_tokens=5, **force)
    assert EOS not in ids[:5]
    assert ids[5] == EOS and len(ids) == 6
    assert choice.finish_reason == "stop" and r.usage.completion_tokens == 6
    # The five are the plain greedy tokens (EOS was not the plain choice before them).
    plain, _, _ = complete(client, model, max_tokens=5)
    assert ids[:5] == plain


def test_min_tokens_holds_stop_strings_off(client, model):
    # vLLM: stop strings apply once min_tokens tokens are out; their earlier text is not searched.
    plain, choice, _ = complete(client, model, max_tokens=32)
    word = choice.text.split()[0]
    _, early, r_early = complete(client, model, max_tokens=32, stop=[word])
    assert early.finish_reason == "stop" and word not in early.text
    held_off = r_early.usage.completion_tokens + 3
    ids, held, r = complete(client, model, max_tokens=32, stop=[word], min_tokens=held_off)
    assert r.usage.completion_tokens >= held_off
    assert ids[:held_off] == plain[:held_off]
    assert word in held.text


def test_min_tokens_holds_stop_token_ids_off(client, model):
    plain, _, _ = complete(client, model, max_tokens=32)
    k = next(k for k in range(2, len(plain)) if plain[k] not in plain[:k] and plain[k] != EOS)
    stop = plain[k]
    ids, choice, _ = complete(client, model, max_tokens=32, stop_token_ids=[stop],
                              min_tokens=k + 4)
    assert len(ids) >= k + 4
    assert stop not in ids[:k + 4]
    assert ids[:k] == plain[:k]
    if choice.finish_reason == "stop":  # ended by the stop id, once allowed
        assert ids[-1] == stop
    else:
        assert choice.finish_reason == "length" and len(ids) == 32


def test_min_tokens_with_chat(client, model):
    msg = [{"role": "user", "content": "Who made the heaven and the earth?"}]
    forced = client.chat.completions.create(model=model, messages=msg, max_tokens=40,
                                            temperature=0, logit_bias={str(EOS): 100})
    assert forced.usage.completion_tokens == 1 and forced.choices[0].message.content == ""
    held = client.chat.completions.create(model=model, messages=msg, max_tokens=40,
                                          temperature=0, logit_bias={str(EOS): 100},
                                          extra_body={"min_tokens": 7})
    assert held.usage.completion_tokens == 8 and held.choices[0].finish_reason == "stop"


def test_best_of_returns_the_best_candidates(client, model):
    kw = dict(model=model, prompt=PROMPT, max_tokens=12, temperature=1.0, seed=7, logprobs=0)
    # The candidates: best_of choices share the seed, choice i sampled as choice i of n.
    every = client.completions.create(n=4, **kw)
    scores = [sum(c.logprobs.token_logprobs) for c in every.choices]
    best = client.completions.create(n=2, extra_body={"best_of": 4}, **kw)
    assert [c.index for c in best.choices] == [0, 1]
    order = sorted(range(4), key=lambda i: -scores[i])
    assert [c.text for c in best.choices] == [every.choices[i].text for i in order[:2]]
    got = [sum(c.logprobs.token_logprobs) for c in best.choices]
    assert got == pytest.approx(sorted(scores, reverse=True)[:2], abs=1e-4)
    # Usage counts every candidate's tokens.
    assert best.usage.completion_tokens == every.usage.completion_tokens
    # n = 1: the single best of 4.
    one = client.completions.create(n=1, extra_body={"best_of": 4}, **kw)
    assert one.choices[0].text == every.choices[order[0]].text
    # best_of = n is plain n.
    same = client.completions.create(n=4, extra_body={"best_of": 4}, **kw)
    assert [c.text for c in same.choices] == [c.text for c in every.choices]


def test_best_of_refusals(base_url, model):
    for extra, words in (({"n": 3, "best_of": 2}, "at least n"),
                         ({"best_of": 2, "stream": True}, "cannot be streamed")):
        body = {"model": model, "prompt": PROMPT, "max_tokens": 2, **extra}
        req = urllib.request.Request(base_url + "/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=60)
        assert e.value.code == 400
        error = json.loads(e.value.read())["error"]
        assert error["param"] == "best_of" and words in error["message"]


def test_max_completion_tokens_bounds_and_wins(client, model):
    msg = [{"role": "user", "content": "Who made the heaven and the earth?"}]
    plain = client.chat.completions.create(model=model, messages=msg, max_tokens=20,
                                           temperature=0, extra_body={"ignore_eos": True})
    assert plain.usage.completion_tokens == 20
    for kw in ({"max_completion_tokens": 5}, {"max_completion_tokens": 5, "max_tokens": 12}):
        r = client.chat.completions.create(model=model, messages=msg, temperature=0,
                                           extra_body={"ignore_eos": True, **kw})
        assert r.usage.completion_tokens == 5 and r.choices[0].finish_reason == "length"
        assert plain.choices[0].message.content.startswith(r.choices[0].message.content)
