"""TLS on `sluice serve`'s listeners: the official `openai` SDK over HTTPS with a custom CA
(certificates made here with the openssl CLI), a client without the CA refused, the gRPC API over
TLS, and a rotated certificate picked up without a restart.
"""

import os
import pathlib
import shutil
import socket
import ssl
import subprocess
import tempfile
import time

import grpc
import httpx
import openai
import pytest

from conftest import MODEL_NAME, ServerProcess
from ports import free_port


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_ca(d: pathlib.Path, name: str):
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-subj", f"/CN={name}", "-keyout", f"{name}.key", "-out", f"{name}.pem", cwd=d)


def make_server_cert(d: pathlib.Path, ca: str, name: str):
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost",
            "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=d)
    (d / "san.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
            "-CAcreateserial", "-days", "2", "-extfile", "san.ext", "-out", f"{name}.pem", cwd=d)


@pytest.fixture(scope="module")
def pki():
    d = pathlib.Path(tempfile.mkdtemp(prefix="sluice-tls-"))
    make_ca(d, "ca")
    make_ca(d, "ca2")
    make_server_cert(d, "ca", "server")
    make_server_cert(d, "ca2", "server2")
    shutil.copy(d / "server.pem", d / "live.pem")
    shutil.copy(d / "server.key", d / "live.key")
    return d


@pytest.fixture(scope="module")
def server(pki):
    grpc_port = free_port()
    proc = ServerProcess(extra_args=["--tls-cert", str(pki / "live.pem"), "--tls-key",
                                     str(pki / "live.key"), "--grpc-port", str(grpc_port)],
                         ca_file=str(pki / "ca.pem"))
    proc.grpc_address = f"localhost:{grpc_port}"
    yield proc
    assert proc.stop() == 0, proc.logs()


def https_client(server, ca):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120,
                         http_client=httpx.Client(verify=ssl.create_default_context(cafile=ca)))


def test_openai_sdk_over_https_with_custom_ca(server, pki):
    assert server.url.startswith("https://")
    client = https_client(server, str(pki / "ca.pem"))
    out = client.completions.create(model=MODEL_NAME, prompt="Hello", max_tokens=3,
                                    temperature=0)
    assert out.usage.completion_tokens == 3
    chunks = list(client.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "Hi"}], max_tokens=3,
        stream=True, extra_body={"ignore_eos": True}))
    assert chunks[-1].choices[0].finish_reason == "length"
    # A client that does not trust the CA refuses the server.
    with pytest.raises(openai.APIConnectionError):
        https_client(server, str(pki / "ca2.pem")).models.list()
    # Plain HTTP on the TLS port gets no response.
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert not s.recv(4096).startswith(b"HTTP/1.1 200")


def test_grpc_over_tls(server, pki):
    from grpc_stubs import pb, pb_grpc
    creds = grpc.ssl_channel_credentials(root_certificates=(pki / "ca.pem").read_bytes())
    stub = pb_grpc.InferenceStub(grpc.secure_channel(server.grpc_address, creds))
    assert stub.Health(pb.HealthRequest(), timeout=60).status == pb.HealthResponse.SERVING
    request = pb.GenerateRequest(text="Hello")
    request.sampling.max_tokens = 2
    request.sampling.ignore_eos = True  # a sampled EOS would end it early
    assert list(stub.Generate(request, timeout=60))[-1].usage.completion_tokens == 2


def test_rotated_certificate_is_picked_up(server, pki):
    # Rotate to a certificate of another CA: new connections get it, without a restart.
    shutil.copy(pki / "server2.key", pki / "live.key.tmp")
    shutil.copy(pki / "server2.pem", pki / "live.pem.tmp")
    os.replace(pki / "live.key.tmp", pki / "live.key")
    os.replace(pki / "live.pem.tmp", pki / "live.pem")
    deadline = time.monotonic() + 30
    while True:
        try:
            https_client(server, str(pki / "ca2.pem")).models.list()
            break
        except openai.APIConnectionError:
            assert time.monotonic() < deadline, server.logs()
            time.sleep(0.5)
    with pytest.raises(openai.APIConnectionError):
        https_client(server, str(pki / "ca.pem")).models.list()
    assert server.proc.poll() is None
