"""Vision-language chat through the official openai SDK on `sluice serve` with
../shared/fixtures/llava-tiny (issue 26): the fixture's two prompts (one PNG; a system message
and two images, PNG and JPEG, marked inline) give the reference greedy tokens, in the OpenAI
string convention and in the Hugging Face content-parts convention (a request chat_template
that iterates over parts); the same image twice hits the encoder cache; two different images
never share KV blocks; every kind of bad image is a 400 naming the problem and the server keeps
serving."""

import json
import urllib.request

import numpy as np
import openai
import pytest
from tokenizers import Tokenizer

from conftest import ServerProcess
from llava_tiny import (FIXTURE, HF_TEMPLATE, LIMIT_ARGS, PROMPT0, PROMPT1, bad_images as
                        common_bad_images, data_url, fixture_image, golden, image_part,
                        noise_png, png, want_text)
from ports import free_port


@pytest.fixture(scope="module")
def vl_server():
    grpc_port = free_port()
    proc = ServerProcess(extra_args=[*LIMIT_ARGS, "--grpc-port", str(grpc_port)],
                         model_dir=FIXTURE)
    proc.grpc_address = f"127.0.0.1:{grpc_port}"
    yield proc
    assert proc.stop() == 0, proc.logs()


@pytest.fixture(scope="module")
def vl(vl_server):
    return openai.OpenAI(base_url=vl_server.url + "/v1", api_key="sk-unused", max_retries=0,
                         timeout=120)


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer.from_file(str(FIXTURE / "tokenizer.json"))


def chat(client, messages, **kw):
    return client.chat.completions.create(model="llava-tiny", messages=messages, temperature=0,
                                          max_tokens=32, **kw)


def metric(server, name) -> float:
    with urllib.request.urlopen(server.url + "/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


@pytest.mark.parametrize("case,messages,extra", [
    (0, PROMPT0, {}),
    (1, PROMPT1, {}),
    (0, PROMPT0, {"extra_body": {"chat_template": HF_TEMPLATE}}),
], ids=["one-png", "system-png-jpeg-inline", "hf-content-parts"])
def test_reference_greedy_tokens(vl, tokenizer, case, messages, extra):
    reply = chat(vl, messages, **extra)
    want = want_text(tokenizer, case)
    assert reply.choices[0].message.content == want
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.prompt_tokens == len(golden(f"input_ids_{case}"))  # 16 tokens per image


def test_streaming_with_an_image(vl, tokenizer):
    stream = vl.chat.completions.create(model="llava-tiny", messages=PROMPT0, temperature=0,
                                        max_tokens=32, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == want_text(tokenizer, 0)


def test_same_image_hits_the_encoder_cache_and_the_prefix_cache(vl, vl_server):
    image = png(np.full((40, 50, 3), 77, dtype=np.uint8))
    messages = [{"role": "user", "content": [image_part(image),
                                             {"type": "text", "text": "Describe it, please."}]}]
    encoded = metric(vl_server, "sluice_images_encoded_total")
    first = chat(vl, messages)
    assert metric(vl_server, "sluice_images_encoded_total") == encoded + 1
    hits, misses = (metric(vl_server, "sluice_encoder_cache_hits_total"),
                    metric(vl_server, "sluice_encoder_cache_misses_total"))
    seconds = metric(vl_server, "sluice_image_encode_seconds_total")
    assert seconds > 0
    second = chat(vl, messages)
    assert metric(vl_server, "sluice_encoder_cache_hits_total") == hits + 1
    assert metric(vl_server, "sluice_encoder_cache_misses_total") == misses
    # A cache hit is not an encode: neither counter moves.
    assert metric(vl_server, "sluice_images_encoded_total") == encoded + 1
    assert metric(vl_server, "sluice_image_encode_seconds_total") == seconds
    assert second.choices[0].message.content == first.choices[0].message.content
    assert second.usage.prompt_tokens_details.cached_tokens >= 16


def test_different_images_give_different_outputs_and_share_no_blocks(vl):
    def ask(pixels):
        return chat(vl, [{"role": "user", "content": [
            image_part(png(pixels)), {"type": "text", "text": "What colour is this?"}]}])

    rng = np.random.default_rng(26)
    a = ask(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8))
    b = ask(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8))
    assert a.choices[0].message.content != b.choices[0].message.content
    # The image starts at token 3, inside the first KV block: nothing before it is a full block.
    assert b.usage.prompt_tokens_details.cached_tokens == 0


def bad_images():
    whole = noise_png(np.random.default_rng(7))
    return common_bad_images(
        ("http-url", [{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}],
         "image URLs (http/https) are not fetched")) + [
        ("bad-detail", [image_part(whole, detail="ultra")], "detail must be"),
        ("extra-placeholder", [{"type": "text", "text": "<|image|> and <|image|>"},
                               image_part(whole)], "placeholders"),
    ]


@pytest.mark.parametrize("name,parts,fragment", bad_images(), ids=[c[0] for c in bad_images()])
def test_bad_images_are_400_naming_the_problem(vl, tokenizer, name, parts, fragment):
    with pytest.raises(openai.BadRequestError) as err:
        chat(vl, [{"role": "user", "content": parts + [{"type": "text", "text": "Hi"}]}])
    assert err.value.status_code == 400
    assert fragment in err.value.message, err.value.message
    # The server keeps serving.
    reply = chat(vl, PROMPT0)
    assert reply.choices[0].message.content == want_text(tokenizer, 0)


def test_text_only_model_refuses_image_parts(client, model):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=model, max_tokens=4, messages=[
            {"role": "user", "content": [image_part(fixture_image("image_0.png"))]}])
    assert "this model takes no images" in err.value.message


def test_generate_lines_with_images(tmp_path, tokenizer):
    import subprocess
    from conftest import sluice_bin
    lines = [
        {"custom_id": "one", "messages": PROMPT0, "temperature": 0, "max_tokens": 32},
        {"custom_id": "two", "messages": PROMPT1, "temperature": 0, "max_tokens": 32},
        {"custom_id": "bomb", "messages": [{"role": "user", "content": [bad_images()[5][1][0]]}]},
    ]
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps(line) + "\n" for line in lines))
    proc = subprocess.run([sluice_bin(), "generate", "--model", str(FIXTURE), "--input", str(src),
                           "--output", str(dst), "--no-progress", "--max-model-len", "256"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = [json.loads(line) for line in dst.read_text().splitlines()]
    for i, case in enumerate([0, 1]):
        want = want_text(tokenizer, case)
        assert out[i]["choices"][0]["message"]["content"] == want
    assert "decompression bomb" in out[2]["error"]["message"]


def test_grpc_generate_with_images(vl_server, tokenizer):
    import importlib
    import grpc
    from grpc_stubs import pb, pb_grpc
    common = importlib.import_module("sluice.v1.common_pb2")  # generated beside pb
    stub = pb_grpc.InferenceStub(grpc.insecure_channel(vl_server.grpc_address))
    chat = pb.ChatPrompt(add_generation_prompt=True, messages=[
        pb.ChatMessage(role="system", content="You compare pictures."),
        pb.ChatMessage(role="user", parts=[
            pb.ContentPart(text="Compare <|image|> with <|image|>. Which one is brighter?"),
            pb.ContentPart(image=pb.ImagePart(data=fixture_image("image_1.png"))),
            pb.ContentPart(image=pb.ImagePart(
                url=data_url(fixture_image("image_2.jpg"), "image/jpeg"), detail="low")),
        ])])
    request = pb.GenerateRequest(chat=chat, detokenize=True,
                                 sampling=common.SamplingParams(temperature=0, max_tokens=32))
    ids = [t.token_id for out in stub.Generate(request, timeout=60) for t in out.tokens]
    assert ids == golden("greedy_1").tolist()
    bad = pb.GenerateRequest(chat=pb.ChatPrompt(messages=[pb.ChatMessage(role="user", parts=[
        pb.ContentPart(image=pb.ImagePart(data=b"<svg xmlns='http://www.w3.org/2000/svg'/>"))])]))
    with pytest.raises(grpc.RpcError) as err:
        list(stub.Generate(bad, timeout=60))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "SVG images are not supported" in err.value.details()
