"""`sluice kvstore`: blocks put through the client survive kill -9 (served byte-exact from the SSD
tier after a restart), a block corrupted on disk is a miss (and deleted), blocks spread over
shards by rendezvous hashing, the inline gRPC fallback, /metrics, and the k8s StatefulSet.

Blocks are written and read by `kvstore_tool` (beside the sluice binary), which fills block i of
a layout with deterministic bytes and checks them byte for byte on a get.
"""

import json
import os
import pathlib
import selectors
import signal
import subprocess
import time

import pytest
import yaml

from sluice_cluster import REPO, http_get, sluice_bin, sum_samples

TOOL = str(pathlib.Path(sluice_bin()).parent / "kvstore_tool")
BLOCK_BYTES = 16384
GOLDEN = 0x9E3779B97F4A7C15
ENV = dict(os.environ, UCX_LOG_LEVEL="fatal", UCX_WARN_UNUSED_ENV_VARS="n")

needs_tool = pytest.mark.skipif(not os.access(TOOL, os.X_OK), reason=f"no {TOOL} (build all targets)")


class KvStore:
    """One `sluice kvstore` process on loopback (gRPC and metrics on free ports)."""

    def __init__(self, ssd_dir, log_path, *extra):
        self.log = open(log_path, "ab")
        self.proc = subprocess.Popen(
            [sluice_bin(), "kvstore", "--port", "0", "--metrics-port", "0",
             "--dram-bytes", "4M", "--dram-page-bytes", "1M", "--ssd-dir", str(ssd_dir),
             "--ssd-bytes", "64M", "--ttl-hours", "72", *extra],
            stdout=subprocess.PIPE, stderr=self.log, env=ENV)
        line = self._read_line(timeout=30)
        # "Sluice kvstore listening on HOST:PORT metrics http://HOST:PORT/metrics (data path: X)"
        words = line.split()
        assert words[:3] == ["Sluice", "kvstore", "listening"], line
        self.address = words[4]
        self.metrics_url = words[6]

    def _read_line(self, timeout):
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        buf = b""
        while b"\n" not in buf:
            left = deadline - time.monotonic()
            if left <= 0 or self.proc.poll() is not None:
                raise RuntimeError(f"kvstore did not start (exit {self.proc.poll()})")
            if sel.select(left):
                chunk = os.read(self.proc.stdout.fileno(), 4096)
                if not chunk:
                    raise RuntimeError("kvstore closed stdout")
                buf += chunk
        return buf.decode().splitlines()[0]

    def metrics(self):
        return http_get(self.metrics_url)[1]

    def metric(self, name, tier=None):
        text = self.metrics()
        if tier is None:
            return sum_samples(text, name)
        return sum_samples("\n".join(l for l in text.splitlines() if f'tier="{tier}"' in l), name)

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)
        self.log.close()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if not self.log.closed:
            self.log.close()


@pytest.fixture
def stores(tmp_path):
    started = []

    def start(ssd_dir, *extra):
        s = KvStore(ssd_dir, tmp_path / f"kvstore-{len(started)}.log", *extra)
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()


def tool(command, shards, count, first=0, layout=1, inline=False):
    args = [TOOL, command, "--shards", ",".join(s.address for s in shards), "--count", str(count),
            "--first", str(first), "--layout", str(layout), "--block-bytes", str(BLOCK_BYTES),
            "--timeout-s", "20"]
    if inline:
        args.append("--inline")
    out = subprocess.run(args, capture_output=True, text=True, timeout=60, env=ENV)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def block_file(ssd_dir, i, layout=1):
    hi, lo = (i * GOLDEN) % (1 << 64), i
    return pathlib.Path(ssd_dir) / "blocks" / f"{lo & 0xff:02x}" / f"{layout:016x}{hi:016x}{lo:016x}.blk"


@needs_tool
def test_kill9_restart_serves_ssd_blocks_byte_exact_and_corruption_is_a_miss(stores, tmp_path):
    ssd = tmp_path / "ssd"
    store = stores(ssd)
    put = tool("put", [store], 64)
    assert (put["stored"], put["present"], put["failed"], put["error"]) == (64, 0, 0, "OK")
    got = tool("get", [store], 64)
    assert (got["found"], got["exact"], got["missing"]) == (64, 64, [])
    assert store.metric("sluice_kvstore_hits_total", "dram") == 64
    assert store.metric("sluice_kvstore_blocks", "ssd") == 64
    assert store.metric("sluice_kvstore_active_leases") == 0

    store.kill9()
    store = stores(ssd)
    assert store.metric("sluice_kvstore_blocks", "ssd") == 64
    assert store.metric("sluice_kvstore_blocks", "dram") == 0
    # Flip one payload byte of block 5 on disk (header is 64 bytes).
    path = block_file(ssd, 5)
    data = bytearray(path.read_bytes())
    assert len(data) == 64 + BLOCK_BYTES
    data[64 + 1000] ^= 0x40
    path.write_bytes(bytes(data))

    got = tool("get", [store], 64)
    assert got["missing"] == [5]
    assert (got["found"], got["exact"], got["corrupt"]) == (63, 63, 0)
    assert store.metric("sluice_kvstore_hits_total", "ssd") == 63
    assert store.metric("sluice_kvstore_corrupt_blocks_total") == 1
    assert store.metric("sluice_kvstore_misses_total") == 1
    assert not path.exists()
    # The caller recomputes the block and puts it again; the rest are already there.
    put = tool("put", [store], 64)
    assert (put["stored"], put["present"], put["failed"]) == (1, 63, 0)
    got = tool("get", [store], 64)
    assert (got["found"], got["exact"]) == (64, 64)


@needs_tool
def test_blocks_spread_over_shards_by_rendezvous_hashing(stores, tmp_path):
    shards = [stores(tmp_path / "a"), stores(tmp_path / "b")]
    put = tool("put", shards, 200, layout=9)
    assert (put["stored"], put["failed"]) == (200, 0)
    per_shard = [s.metric("sluice_kvstore_blocks", "ssd") for s in shards]
    assert sum(per_shard) == 200
    assert all(60 <= n <= 140 for n in per_shard), per_shard  # ~100 each
    got = tool("get", shards, 200, layout=9)
    assert (got["found"], got["exact"]) == (200, 200)
    # The client's shard choice does not depend on the list order.
    got = tool("get", shards[::-1], 200, layout=9)
    assert (got["found"], got["exact"]) == (200, 200)
    # Keys never put are misses, not errors.
    got = tool("get", shards, 10, first=1000, layout=9)
    assert (got["found"], got["error"]) == (0, "OK")


@needs_tool
def test_inline_fallback_without_ucx(stores, tmp_path):
    store = stores(tmp_path / "ssd", "--no-ucx")
    put = tool("put", [store], 16, inline=True)
    assert (put["stored"], put["failed"]) == (16, 0)
    got = tool("get", [store], 16, inline=True)
    assert (got["found"], got["exact"]) == (16, 16)
    # A UCX client against a store without UCX: refused with a clear error, nothing stored.
    put = tool("put", [store], 4, first=100)
    assert put["failed"] == 4 and "FAILED_PRECONDITION" in put["error"], put


def test_k8s_statefulset_keeps_a_volume():
    docs = [d for d in yaml.safe_load_all((REPO / "deploy/k8s/base/kvstore.yaml").read_text()) if d]
    sts = next(d for d in docs if d["kind"] == "StatefulSet")
    svc = next(d for d in docs if d["kind"] == "Service")
    assert svc["spec"]["clusterIP"] == "None"
    assert sts["spec"]["serviceName"] == svc["metadata"]["name"]
    c = sts["spec"]["template"]["spec"]["containers"][0]
    args = c["args"]
    assert args[0] == "kvstore"
    claim = sts["spec"]["volumeClaimTemplates"][0]["metadata"]["name"]
    mount = next(m for m in c["volumeMounts"] if m["name"] == claim)
    assert args[args.index("--ssd-dir") + 1].startswith(mount["mountPath"] + "/")
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"grpc": int(args[args.index("--port") + 1]),
                     "http": int(args[args.index("--metrics-port") + 1])}
    assert c["readinessProbe"]["httpGet"]["path"] == "/health"
    assert "kvstore.yaml" in yaml.safe_load(
        (REPO / "deploy/k8s/base/kustomization.yaml").read_text())["resources"]
