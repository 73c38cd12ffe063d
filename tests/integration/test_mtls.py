"""mTLS between the services and KV transfer tokens (docs/security.md).

A CA, a second ("rogue") CA and the services' certificates are made here with the openssl CLI.
One cluster: `sluice router --tls-cert/--tls-key/--tls-ca` (HTTPS for clients, mTLS to the
workers) + 1 prefill + 1 decode worker with --tls-cert/--tls-key/--tls-ca, KV moved in push
mode (decode -> prefill PushKv, prefill RMA-writes into decode's blocks), so every control hop
(registration, Prefill/Reserve/Decode, PushKv, Release, KV events) runs over mTLS.

1. A chat completion through the mTLS cluster equals `sluice serve`'s (greedy).
2. Callers without a certificate, or with one of another CA, are refused at the handshake
   (UNAVAILABLE) by the workers; the router's Registry answers UNAUTHENTICATED to a TLS caller
   without a certificate, while its public Inference API still serves one. A worker without a
   certificate, or with a certificate of another CA, never registers. The cluster keeps serving.
3. A forged or missing transfer token: PushKv and Release of a pinned prefill are
   PERMISSION_DENIED and the pinned blocks stay; the right token releases them. Likewise the
   decode worker's reservation: Decode and Cancel without its token are PERMISSION_DENIED.
4. Start-up errors: a missing file, a key of another certificate, a certificate of another CA,
   the router's (or `sluice serve`'s) --tls-ca without --tls-cert: exit 1 with a message naming
   the problem.
5. `sluice serve --kvstore --tls-cert/--tls-key/--tls-ca` writes prompt KV through to a kvstore
   that requires mTLS and a second server loads it; without --tls-ca nothing reaches that
   kvstore (the requests still complete).
"""

import importlib
import pathlib
import ssl
import subprocess
import tempfile
import time

import grpc
import httpx
import openai
import pytest

import grpc_stubs
from sluice_cluster import (MODEL_DIR, MODEL_NAME, Cluster, KvStore, Proc, Serve,
                            free_port, sluice_bin, sum_samples, wait_until)

RPC_TIMEOUT_S = 30


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_ca(d: pathlib.Path, name: str):
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
            f"/CN={name}", "-keyout", f"{name}.key", "-out", f"{name}.pem", cwd=d)


def make_cert(d: pathlib.Path, ca: str, name: str):
    """A certificate for both ends of a connection (server and client auth) on loopback."""
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN=sluice-{name}",
            "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=d)
    (d / f"{name}.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n"
                                   "extendedKeyUsage=serverAuth,clientAuth\n")
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
            "-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.pem",
            cwd=d)


def tls_flags(d: pathlib.Path, name: str, ca: str = "ca"):
    return ["--tls-cert", str(d / f"{name}.pem"), "--tls-key", str(d / f"{name}.key"),
            "--tls-ca", str(d / f"{ca}.pem")]


PB = {name: grpc_stubs.modules(name) for name in ("worker", "registry", "inference")}


@pytest.fixture(scope="module")
def pki():
    d = pathlib.Path(tempfile.mkdtemp(prefix="sluice-mtls-"))
    make_ca(d, "ca")
    make_ca(d, "rogue")
    for name in ("router", "prefill", "decode", "client", "kvstore", "serve"):
        make_cert(d, "ca", name)
    make_cert(d, "rogue", "intruder")
    return d


@pytest.fixture(scope="module")
def cluster(pki):
    context = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    c = Cluster(num_prefill=1, num_decode=1, https_context=context,
                router_args=tls_flags(pki, "router"),
                worker_args=("--kv-transfer-mode", "push", "--kv-pin-timeout-s", "60"),
                role_args={"prefill": tls_flags(pki, "prefill"),
                           "decode": tls_flags(pki, "decode")})
    yield c
    c.stop()


def chat(cluster, pki, i):
    client = openai.OpenAI(base_url=cluster.url + "/v1", api_key="x", timeout=120, max_retries=0,
                           http_client=httpx.Client(
                               verify=ssl.create_default_context(cafile=str(pki / "ca.pem"))))
    r = client.chat.completions.create(
        model=MODEL_NAME, temperature=0, max_tokens=10,
        messages=[{"role": "user", "content": f"mTLS {i}: name three rivers."}])
    return r.choices[0].message.content, r.choices[0].finish_reason, r.usage.completion_tokens


def worker_address(cluster, role):
    (address,) = cluster.addresses(role)
    return address


def channel(pki, address, client=None, ca="ca"):
    """A TLS channel to `address` trusting `ca`, presenting certificate `client` (None: none)."""
    key = (pki / f"{client}.key").read_bytes() if client else None
    cert = (pki / f"{client}.pem").read_bytes() if client else None
    creds = grpc.ssl_channel_credentials((pki / f"{ca}.pem").read_bytes(), key, cert)
    return grpc.secure_channel(address, creds)


def release(pki, address, request_id, token, client="client"):
    worker_pb, worker_grpc = PB["worker"]
    with channel(pki, address, client) as ch:
        return worker_grpc.PrefillWorkerStub(ch).Release(
            worker_pb.ReleaseRequest(request_id=request_id, transfer_token=token),
            timeout=RPC_TIMEOUT_S)


def test_completion_over_mtls_matches_sluice_serve(cluster, pki):
    serve = Serve()
    try:
        client = openai.OpenAI(base_url=serve.url + "/v1", api_key="x", timeout=120,
                               max_retries=0)
        r = client.chat.completions.create(
            model=MODEL_NAME, temperature=0, max_tokens=10,
            messages=[{"role": "user", "content": "mTLS 0: name three rivers."}])
        reference = (r.choices[0].message.content, r.choices[0].finish_reason,
                     r.usage.completion_tokens)
    finally:
        serve.stop()
    assert chat(cluster, pki, 0) == reference
    # The KV moved: prefill pushed it to the decode worker (PushKv over mTLS, with its token).
    prefill = cluster.worker_metrics_text("prefill-0")
    assert sum_samples(prefill, "sluice_kv_transfer_seconds_count") >= 1
    assert 'sluice_kv_transfers_total{result="failed"} 0' in prefill


def test_callers_without_a_cluster_certificate_are_refused(cluster, pki):
    worker_pb, worker_grpc = PB["worker"]
    registry_pb, registry_grpc = PB["registry"]
    inference_pb, inference_grpc = PB["inference"]
    for role in ("prefill", "decode"):
        address = worker_address(cluster, role)
        for client in (None, "intruder"):
            with channel(pki, address, client) as ch:
                with pytest.raises(grpc.RpcError) as e:
                    worker_grpc.PrefillWorkerStub(ch).Release(
                        worker_pb.ReleaseRequest(request_id="x"), timeout=10)
                assert e.value.code() == grpc.StatusCode.UNAVAILABLE, (role, client)
        # Plaintext: no handshake at all.
        with grpc.insecure_channel(address) as ch:
            with pytest.raises(grpc.RpcError) as e:
                worker_grpc.PrefillWorkerStub(ch).Release(worker_pb.ReleaseRequest(request_id="x"),
                                                          timeout=10)
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    # A cluster certificate gets through (an unknown request: nothing released).
    assert not release(pki, worker_address(cluster, "prefill"), "unknown", b"").released

    router = f"127.0.0.1:{cluster.grpc_port}"
    worker = registry_pb.WorkerInfo(role=registry_pb.WORKER_ROLE_DECODE, address="127.0.0.1:1",
                                    model=MODEL_NAME, kv_block_size=16, num_total_blocks=64)
    with channel(pki, router) as ch:  # TLS, no client certificate
        with pytest.raises(grpc.RpcError) as e:
            registry_grpc.RegistryStub(ch).Register(registry_pb.RegisterRequest(worker=worker),
                                                    timeout=10)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # The public API on the same port takes clients without a certificate.
        health = inference_grpc.InferenceStub(ch).Health(inference_pb.HealthRequest(), timeout=10)
        assert health is not None
    with channel(pki, router, "intruder") as ch:  # a certificate of another CA: no handshake
        with pytest.raises(grpc.RpcError) as e:
            registry_grpc.RegistryStub(ch).Register(registry_pb.RegisterRequest(worker=worker),
                                                    timeout=10)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE

    # Workers without a certificate of the CA never register.
    binary = sluice_bin()
    intruders = []
    for name, flags in (("plain", []), ("rogue", tls_flags(pki, "intruder", ca="rogue"))):
        intruders.append(Proc(f"intruder-{name}", [
            binary, "decode", "--model", str(MODEL_DIR), "--listen", f"127.0.0.1:{free_port()}",
            "--router", router, *flags], cluster.dir))
    try:
        def refused(p):
            return "register with router" in p.log_path.read_text(errors="replace")
        wait_until(lambda: all(refused(p) for p in intruders), 120, "intruders tried to register")
        time.sleep(2)
        for p in intruders:
            assert p.proc.poll() is None, p.tail()
        assert cluster.addresses("decode") == {worker_address(cluster, "decode")}
    finally:
        for p in intruders:
            p.stop()
    # The cluster kept serving.
    content, finish, tokens = chat(cluster, pki, 1)
    assert finish in ("stop", "length") and tokens >= 1


def test_forged_transfer_token_is_refused(cluster, pki):
    worker_pb, worker_grpc = PB["worker"]
    common_pb = importlib.import_module("sluice.v1.common_pb2")
    address = worker_address(cluster, "prefill")
    with channel(pki, address, "client") as ch:
        stub = worker_grpc.PrefillWorkerStub(ch)
        pinned = stub.Prefill(worker_pb.PrefillRequest(
            request_id="forged-1", prompt_token_ids=list(range(100, 164)),
            sampling=common_pb.SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)),
            timeout=RPC_TIMEOUT_S)
        token = pinned.kv.transfer_token
        assert len(token) == 16 and pinned.kv.runs
        # The worker publishes its engine's figures after each step: wait for the pin to show.
        wait_until(lambda: cluster.worker_metric("prefill-0", "sluice_prefill_held_blocks") >= 4,
                   10, "the pinned blocks on /metrics")
        held = cluster.worker_metric("prefill-0", "sluice_prefill_held_blocks")
        destination = worker_pb.PushKvRequest(request_id="forged-1", destination=pinned.kv,
                                              timeout_ms=2000)
        forged = bytes([token[0] ^ 1]) + token[1:]
        for bad in (forged, b""):
            destination.transfer_token = bad
            with pytest.raises(grpc.RpcError) as e:
                stub.PushKv(destination, timeout=RPC_TIMEOUT_S)
            assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED, e.value.details()
            assert "transfer token" in e.value.details()
            with pytest.raises(grpc.RpcError) as e:
                stub.Release(worker_pb.ReleaseRequest(request_id="forged-1", transfer_token=bad),
                             timeout=RPC_TIMEOUT_S)
            assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
        # Nothing was touched: the blocks are still pinned, nothing was pushed.
        assert cluster.worker_metric("prefill-0", "sluice_prefill_held_blocks") == held
        released = stub.Release(worker_pb.ReleaseRequest(request_id="forged-1",
                                                         transfer_token=token),
                                timeout=RPC_TIMEOUT_S)
        assert released.released
    wait_until(lambda: cluster.worker_metric("prefill-0", "sluice_prefill_held_blocks") == 0, 15,
               "the pin released")


def test_decode_reservation_needs_its_token(cluster, pki):
    worker_pb, worker_grpc = PB["worker"]
    common_pb = importlib.import_module("sluice.v1.common_pb2")
    with channel(pki, worker_address(cluster, "decode"), "client") as ch:
        stub = worker_grpc.DecodeWorkerStub(ch)
        free = cluster.worker_metric("decode-0", "sluice_kv_cache_free_blocks")
        reserved = stub.Reserve(worker_pb.ReserveRequest(
            request_id="grant-1", prompt_token_ids=list(range(100, 164)),
            sampling=common_pb.SamplingParams(temperature=0, max_tokens=4)),
            timeout=RPC_TIMEOUT_S)
        token = reserved.reservation_token
        assert len(token) == 16 and reserved.kv.runs and not reserved.kv.transfer_token
        held = free - cluster.worker_metric("decode-0", "sluice_kv_cache_free_blocks")
        assert held >= 4
        forged = bytes([token[0] ^ 1]) + token[1:]
        for bad in (forged, b""):
            with pytest.raises(grpc.RpcError) as e:
                stub.Cancel(worker_pb.CancelRequest(request_id="grant-1", reservation_token=bad),
                            timeout=RPC_TIMEOUT_S)
            assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED, e.value.details()
            # A Decode without a prefill result would replace the reservation with a local run.
            with pytest.raises(grpc.RpcError) as e:
                list(stub.Decode(worker_pb.DecodeRequest(
                    request_id="grant-1", prompt_token_ids=list(range(100, 164)),
                    sampling=common_pb.SamplingParams(temperature=0, max_tokens=4),
                    reservation_token=bad), timeout=RPC_TIMEOUT_S))
            assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED, e.value.details()
        assert cluster.worker_metric("decode-0", "sluice_decode_reserved_transfers") == 1
        assert free - cluster.worker_metric("decode-0", "sluice_kv_cache_free_blocks") == held
        assert stub.Cancel(worker_pb.CancelRequest(request_id="grant-1", reservation_token=token),
                           timeout=RPC_TIMEOUT_S).found
    wait_until(lambda: cluster.worker_metric("decode-0", "sluice_kv_cache_free_blocks") == free,
               15, "the reservation freed")


def complete(url, context, ids):
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", timeout=120, max_retries=0,
                           http_client=httpx.Client(verify=context) if context else None)
    r = client.completions.create(model=MODEL_NAME, prompt=ids, temperature=0, max_tokens=8,
                                  extra_body={"ignore_eos": True})
    return r.choices[0].text, r.usage.prompt_tokens_details.cached_tokens


def test_serve_reaches_an_mtls_kvstore_with_its_certificate(pki):
    store = KvStore(tempfile.mkdtemp(prefix="sluice-kvstore-"), extra=tls_flags(pki, "kvstore"))
    context = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    ids = list(range(200, 264))  # 64 tokens: full blocks to write through
    stored = "sluice_kvstore_blocks_stored_total"
    try:
        # Plaintext towards a kvstore that requires mTLS: no handshake, nothing stored; the cache
        # never fails a request.
        plain = Serve(args=("--kvstore", store.address))
        try:
            text, cached = complete(plain.url, None, ids)
            assert cached == 0
            time.sleep(2)
        finally:
            plain.stop()
        assert store.metric(stored) == 0
        args = ("--kvstore", store.address, *tls_flags(pki, "serve"))
        a = Serve(args=args, https_context=context)
        try:
            assert complete(a.url, context, ids) == (text, 0)
            wait_until(lambda: store.metric(stored) >= 4, 15, "write-through over mTLS")
        finally:
            a.stop()
        b = Serve(args=args, https_context=context)
        try:
            text_b, cached_b = complete(b.url, context, ids)
        finally:
            b.stop()
        assert cached_b >= 48 and text_b == text  # loaded from the kvstore over mTLS
    finally:
        store.proc.stop()


def start_error(args):
    r = subprocess.run(args, capture_output=True, text=True, timeout=60)
    return r.returncode, r.stdout + r.stderr


def test_bad_certificate_files_are_start_up_errors(pki):
    binary = sluice_bin()
    base = [binary, "decode", "--model", str(MODEL_DIR), "--listen", f"127.0.0.1:{free_port()}"]
    cases = [
        (["--tls-cert", str(pki / "missing.pem"), "--tls-key", str(pki / "decode.key"),
          "--tls-ca", str(pki / "ca.pem")], "cannot read certificate"),
        (["--tls-cert", str(pki / "decode.pem"), "--tls-key", str(pki / "prefill.key"),
          "--tls-ca", str(pki / "ca.pem")], "does not match certificate"),
        (tls_flags(pki, "intruder"), "does not verify against CA"),
        (["--tls-cert", str(pki / "decode.pem"), "--tls-key", str(pki / "decode.key"),
          "--tls-ca", str(pki / "decode.key")], "holds no PEM certificate"),
    ]
    for flags, message in cases:
        rc, out = start_error(base + flags)
        assert rc == 1 and message in out, (flags, rc, out[-2000:])
    rc, out = start_error([binary, "kvstore", "--port", "0", "--metrics-port", "0",
                           *tls_flags(pki, "intruder")])
    assert rc == 1 and "does not verify against CA" in out, out[-2000:]
    rc, out = start_error([binary, "router", "--model", str(MODEL_DIR), "--port", "0",
                           "--grpc-port", "0", "--tls-ca", str(pki / "ca.pem")])
    assert rc == 1 and "--tls-ca needs --tls-cert" in out, out[-2000:]
    rc, out = start_error([binary, "serve", "--model", str(MODEL_DIR), "--port", "0",
                           "--kvstore", "127.0.0.1:1", "--tls-ca", str(pki / "ca.pem")])
    assert rc == 1 and "--tls-ca needs --tls-cert" in out, out[-2000:]
    rc, out = start_error([binary, "serve", "--model", str(MODEL_DIR), "--port", "0",
                           "--kvstore", "127.0.0.1:1", *tls_flags(pki, "intruder")])
    assert rc == 1 and "does not verify against CA" in out, out[-2000:]
