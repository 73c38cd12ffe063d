"""Deterministic sampling through the OpenAI API: a seed gives the same text alone or inside a
batch of concurrent requests, choices of one request differ, and every response reports the seed
that reproduces it (a generated one when the request had none)."""

import concurrent.futures

PROMPT = "In a small village by the sea"


def _complete(client, model, **kwargs):
    args = dict(model=model, prompt=PROMPT, max_tokens=24, temperature=1.0, top_p=0.95)
    args.update(kwargs)
    return client.completions.create(**args)


def test_same_seed_alone_and_inside_a_batch(client, model):
    alone = _complete(client, model, seed=2027)
    assert alone.model_extra["seed"] == 2027
    others = [dict(prompt=f"Story {i}: the fox and the {i % 5} crows", seed=i, max_tokens=8 + i)
              for i in range(12)]
    with concurrent.futures.ThreadPoolExecutor(max_workers=13) as pool:
        futures = [pool.submit(_complete, client, model, **o) for o in others]
        batched = pool.submit(_complete, client, model, seed=2027)
        futures.append(batched)
        for f in futures:
            f.result()
    assert batched.result().choices[0].text == alone.choices[0].text
    # The draws matter here: a different seed (almost surely) gives other text.
    assert _complete(client, model, seed=2028).choices[0].text != alone.choices[0].text


def test_choices_share_the_seed_but_differ(client, model):
    both = _complete(client, model, seed=5, n=2)
    texts = [c.text for c in sorted(both.choices, key=lambda c: c.index)]
    assert texts[0] != texts[1]
    # Choice 0 is the request's single choice with that seed.
    assert _complete(client, model, seed=5).choices[0].text == texts[0]


def test_unseeded_response_reports_a_seed_that_reproduces_it(client, model):
    first = _complete(client, model)
    seed = first.model_extra["seed"]
    assert isinstance(seed, int) and 0 <= seed < 2**53
    assert _complete(client, model, seed=seed).choices[0].text == first.choices[0].text
    chunks = list(client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": PROMPT}], max_tokens=12,
        temperature=1.0, stream=True))
    seeds = {c.model_extra["seed"] for c in chunks}
    assert len(seeds) == 1
    replay = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": PROMPT}], max_tokens=12,
        temperature=1.0, seed=seeds.pop())
    assert replay.choices[0].message.content == "".join(
        c.choices[0].delta.content or "" for c in chunks if c.choices)
