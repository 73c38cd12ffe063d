"""`sluice encoder` (issue 26): the gRPC vision encoder service on
../shared/fixtures/llava-tiny returns the reference projected features for the PNG, PNG and JPEG
fixture images, answers the same image from its cache (flag and /metrics counter), and refuses
bad images with INVALID_ARGUMENT naming the image while it keeps serving."""

import importlib
import re
import signal
import subprocess
import urllib.request

import grpc
import numpy as np
import pytest

from conftest import sluice_bin
from grpc_stubs import pb  # noqa: F401  (generates every sluice.v1 module)
from llava_tiny import FIXTURE, fixture_image, golden

enc_pb = importlib.import_module("sluice.v1.encoder_pb2")
enc_grpc = importlib.import_module("sluice.v1.encoder_pb2_grpc")


@pytest.fixture(scope="module")
def encoder():
    proc = subprocess.Popen([sluice_bin(), "encoder", "--model", str(FIXTURE), "--listen",
                             "127.0.0.1:0", "--max-image-pixels", "1000000"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    grpc_address = metrics_url = None
    for line in proc.stdout:
        if m := re.search(r"Sluice encoder listening on (\S+)", line):
            grpc_address = m.group(1)
        if m := re.search(r"Sluice encoder metrics on (\S+)", line):
            metrics_url = m.group(1)
            break
    assert grpc_address and metrics_url, proc.stderr.read()
    yield enc_grpc.EncoderStub(grpc.insecure_channel(grpc_address)), metrics_url
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0


def metric(url, name):
    with urllib.request.urlopen(url, timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(name)


def test_features_match_the_reference_and_repeat_from_the_cache(encoder):
    stub, metrics_url = encoder
    names = ["image_0.png", "image_1.png", "image_2.jpg"]
    reply = stub.Encode(enc_pb.EncodeRequest(images=[fixture_image(n) for n in names]), timeout=60)
    assert len(reply.embeddings) == 3
    for k, e in enumerate(reply.embeddings):
        assert (e.num_tokens, e.hidden_size) == (16, 64)
        got = np.frombuffer(e.values, dtype="<f4").reshape(16, 64)
        assert np.abs(got - golden(f"image_features_{k}")).max() <= 1e-4
        assert len(e.content_hash) == 16 and not e.cache_hit
    hits = metric(metrics_url, "sluice_encoder_cache_hits_total")
    again = stub.Encode(enc_pb.EncodeRequest(images=[fixture_image("image_1.png")]), timeout=60)
    assert again.embeddings[0].cache_hit
    assert again.embeddings[0].values == reply.embeddings[1].values
    assert again.embeddings[0].content_hash == reply.embeddings[1].content_hash
    assert metric(metrics_url, "sluice_encoder_cache_hits_total") == hits + 1


def test_bad_images_are_invalid_argument(encoder):
    stub, metrics_url = encoder
    errors = metric(metrics_url, "sluice_encoder_errors_total")
    for data, fragment in [(b"<svg xmlns='http://www.w3.org/2000/svg'/>", "SVG"),
                           (fixture_image("image_1.png")[:200], "truncated or corrupt PNG"),
                           (b"plain text", "not a PNG, JPEG or WebP")]:
        with pytest.raises(grpc.RpcError) as err:
            stub.Encode(enc_pb.EncodeRequest(images=[fixture_image("image_0.png"), data]),
                        timeout=60)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.value.details().startswith("image 1: ") and fragment in err.value.details()
    assert metric(metrics_url, "sluice_encoder_errors_total") == errors + 3
    ok = stub.Encode(enc_pb.EncodeRequest(images=[fixture_image("image_2.jpg")]), timeout=60)
    assert len(ok.embeddings) == 1
