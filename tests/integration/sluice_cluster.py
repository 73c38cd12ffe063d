"""Multi-process fixtures: a router with prefill/decode workers, and a `sluice serve` reference.

Every process binds loopback ports; every wait has a deadline. The binary comes from $SLUICE_BIN
(default build/bin/sluice), the model is the embedded models/sluice-mini-moe.
"""

import json
import os
import pathlib
import re
import signal
import sys
import subprocess
import tempfile
import time
import urllib.request

REPO = pathlib.Path(__file__).resolve().parents[2]
# Benchmarks import this module by path, outside pytest's pythonpath (tests/pytest.ini).
if str(REPO / "tests" / "testing") not in sys.path:
    sys.path.insert(0, str(REPO / "tests" / "testing"))
from ports import free_port  # noqa: E402,F401  (re-exported: tests import it from here)

MODEL_DIR = REPO / "models" / "sluice-mini-moe"
MODEL_NAME = "sluice-mini-moe"
STARTUP_TIMEOUT_S = float(os.environ.get("SLUICE_STARTUP_TIMEOUT", "300"))


def sluice_bin() -> str:
    path = os.environ.get("SLUICE_BIN", str(REPO / "build" / "bin" / "sluice"))
    return path if os.path.isabs(path) else str(REPO / path)


def http_get(url: str, timeout: float = 5.0, context=None):
    with urllib.request.urlopen(url, timeout=timeout, context=context) as r:
        return r.status, r.read().decode()


def wait_until(predicate, timeout: float, what: str, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except OSError:
            pass
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}")


def sum_samples(text, name):
    """Sum of every sample of metric `name` (any labels) in Prometheus exposition `text`."""
    total = 0.0
    for line in text.splitlines():
        m = re.match(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", line)
        if m:
            total += float(m.group(2))
    return total


class Proc:
    """One service process with its log file."""

    def __init__(self, name, args, log_dir):
        self.name = name
        self.args = args
        self.log_path = pathlib.Path(log_dir) / f"{name}.log"
        self.start()

    def start(self):
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.args, stdout=self.log, stderr=self.log)

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.log.close()

    def tail(self, n=30):
        lines = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(lines[-n:])


class Cluster:
    """`sluice router` + N prefill + M decode (+ K encoder) workers on loopback."""

    def __init__(self, num_prefill, num_decode, worker_args=(), router_args=(), role_args=None,
                 model_dir=MODEL_DIR, num_encoder=0, https_context=None):
        """worker_args go to every prefill/decode worker, role_args[role] (e.g.
        {"prefill": [...]}, {"encoder": [...]}) to one role. Encoders (`sluice encoder`, a
        vision-language model_dir) register with the router like the other workers.
        https_context: an ssl.SSLContext trusting the router's certificate when router_args
        make it serve HTTPS (--tls-cert)."""
        role_args = role_args or {}
        self.dir = tempfile.mkdtemp(prefix="sluice-integration-")
        self.http_port, self.grpc_port = free_port(), free_port()
        self.https_context = https_context
        scheme = "https" if https_context is not None else "http"
        self.url = f"{scheme}://127.0.0.1:{self.http_port}"
        binary = sluice_bin()
        if not os.path.exists(binary):
            raise RuntimeError(f"sluice binary not found at {binary} (set SLUICE_BIN)")
        # Leases of 3 s, tuned from heartbeat jitter up to 5 s at most: the fault tests wait
        # for a silent worker to turn suspect.
        self.router = Proc("router", [binary, "router", "--model", str(model_dir), "--port",
                                      str(self.http_port), "--grpc-port", str(self.grpc_port),
                                      "--lease-seconds", "3", "--max-lease-seconds", "5",
                                      *router_args], self.dir)
        self.workers = {}
        self.extra_procs = []  # started by start_worker, outside the pool wait_registered counts
        self.model_dir = model_dir
        self.metrics_urls = {}  # worker name -> its /metrics URL (HTTP, --http-port)
        for role, count in (("prefill", num_prefill), ("decode", num_decode)):
            for i in range(count):
                name = f"{role}-{i}"
                http_port = free_port()
                self.metrics_urls[name] = f"http://127.0.0.1:{http_port}/metrics"
                self.workers[name] = Proc(name, [
                    binary, role, "--model", str(model_dir), "--listen",
                    f"127.0.0.1:{free_port()}", "--router", f"127.0.0.1:{self.grpc_port}",
                    "--http-port", str(http_port), *worker_args, *role_args.get(role, ())],
                    self.dir)
        for i in range(num_encoder):
            name = f"encoder-{i}"
            http_port = free_port()
            self.metrics_urls[name] = f"http://127.0.0.1:{http_port}/metrics"
            self.workers[name] = Proc(name, [
                binary, "encoder", "--model", str(model_dir), "--listen",
                f"127.0.0.1:{free_port()}", "--router", f"127.0.0.1:{self.grpc_port}",
                "--http-port", str(http_port), *role_args.get("encoder", ())], self.dir)
        try:
            self.wait_registered(num_prefill, num_decode, num_encoder=num_encoder)
        except BaseException:
            # The fixture never gets a Cluster to stop: stop what started, or the workers
            # outlive the test run (they retry registration forever).
            self.stop()
            raise

    def workers_json(self):
        return json.loads(http_get(self.url + "/v1/workers",
                                   context=self.https_context)[1])["data"]

    def addresses(self, role):
        return {w["address"] for w in self.workers_json() if w["role"] == role}

    def wait_registered(self, num_prefill, num_decode, timeout=STARTUP_TIMEOUT_S,
                        num_encoder=0):
        def ready():
            for proc in [self.router, *self.workers.values()]:
                if proc.proc.poll() is not None:
                    raise RuntimeError(f"{proc.name} exited:\n{proc.tail()}")
            live = [w for w in self.workers_json() if not w["draining"]]
            return (sum(w["role"] == "prefill" for w in live) == num_prefill and
                    sum(w["role"] == "decode" for w in live) == num_decode and
                    sum(w["role"] == "encoder" for w in live) == num_encoder and
                    http_get(self.url + "/health", context=self.https_context)[0] == 200)
        wait_until(ready, timeout, f"{num_prefill} prefill + {num_decode} decode + "
                   f"{num_encoder} encoder registered")

    def metric(self, name):
        """Sum of every sample of `name` in the router's /metrics."""
        return sum_samples(http_get(self.url + "/metrics", context=self.https_context)[1], name)

    def worker_metrics_text(self, name):
        """The raw /metrics text of worker `name` (served on its --http-port)."""
        return http_get(self.metrics_urls[name])[1]

    def worker_metric(self, name, metric):
        """Sum of every sample of `metric` in worker `name`'s /metrics."""
        return sum_samples(self.worker_metrics_text(name), metric)

    def start_worker(self, name, role, args=()):
        """One more `role` worker registering with this router (e.g. a misconfigured one),
        with `args`; not in self.workers (wait_registered ignores it); stopped by stop()."""
        proc = Proc(name, [sluice_bin(), role, "--model", str(self.model_dir), "--listen",
                           f"127.0.0.1:{free_port()}", "--router", f"127.0.0.1:{self.grpc_port}",
                           "--http-port", str(free_port()), *args], self.dir)
        self.extra_procs.append(proc)
        return proc

    def stop(self):
        for proc in [*self.extra_procs, *self.workers.values(), self.router]:
            proc.stop()


class Serve:
    """A plain `sluice serve` for reference outputs."""

    def __init__(self, model_dir=MODEL_DIR, args=(), https_context=None):
        """https_context: an ssl.SSLContext trusting the server's certificate when `args` make
        it serve HTTPS (--tls-cert)."""
        self.dir = tempfile.mkdtemp(prefix="sluice-reference-")
        port = free_port()
        scheme = "https" if https_context is not None else "http"
        self.url = f"{scheme}://127.0.0.1:{port}"
        self.proc = Proc("serve", [sluice_bin(), "serve", "--model", str(model_dir), "--port",
                                   str(port), *args], self.dir)

        def healthy():
            if self.proc.proc.poll() is not None:
                raise RuntimeError(f"sluice serve exited:\n{self.proc.tail()}")
            return http_get(self.url + "/health", context=https_context)[0] == 200
        wait_until(healthy, STARTUP_TIMEOUT_S, "sluice serve /health")

    def stop(self):
        self.proc.stop()


class KvStore:
    """`sluice kvstore` on a fixed loopback port (a restart keeps the address and the SSD dir)."""

    def __init__(self, run_dir, extra=(), ucx=False):
        """extra: more flags (e.g. --tls-cert/--tls-key/--tls-ca). ucx: the UCX data path (else
        --no-ucx: clients carry block bytes in the inline gRPC calls)."""
        self.port, self.metrics_port = free_port(), free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.ssd_dir = pathlib.Path(run_dir) / "kvstore-ssd"
        self.proc = Proc("kvstore", [
            sluice_bin(), "kvstore", "--host", "127.0.0.1", "--port", str(self.port),
            "--metrics-host", "127.0.0.1", "--metrics-port", str(self.metrics_port),
            "--dram-bytes", "64M", "--ssd-dir", str(self.ssd_dir), "--ssd-bytes", "256M",
            *([] if ucx else ["--no-ucx"]), *extra], run_dir)
        self.wait_healthy()

    def wait_healthy(self):
        def up():
            if self.proc.proc.poll() is not None:
                raise RuntimeError(f"kvstore exited:\n{self.proc.tail()}")
            return http_get(f"http://127.0.0.1:{self.metrics_port}/health")[0] == 200
        wait_until(up, 30, "kvstore /health")

    def metric(self, name, tier=None):
        text = http_get(f"http://127.0.0.1:{self.metrics_port}/metrics")[1]
        if tier is not None:
            text = "\n".join(l for l in text.splitlines() if f'tier="{tier}"' in l)
        return sum_samples(text, name)

    def block_files(self):
        return set((self.ssd_dir / "blocks").glob("*/*.blk"))

    def restart_after_kill9(self):
        self.proc.kill9()
        self.proc.log.close()
        self.proc.start()
        self.wait_healthy()


def promtool_problems(text):
    """promtool's findings on `text`, less the ':' lint every vllm: name draws (vLLM's own
    exposition draws it too)."""
    result = subprocess.run(["promtool", "check", "metrics"], input=text.encode(),
                            capture_output=True, timeout=30)
    out = (result.stdout + result.stderr).decode()
    assert result.returncode in (0, 3), out  # 3: lint findings only; 1: a parse error
    return [line for line in out.splitlines()
            if line.strip() and not (line.startswith("vllm:") and
                                     "should not contain ':'" in line)]
