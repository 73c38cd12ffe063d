"""Fixtures for the end-to-end tests: one `sluice serve` process for the whole session.

The binary comes from $SLUICE_BIN (default build/bin/sluice), the model is the embedded
models/sluice-mini-moe. The server binds port 0 and the port is read from its ready line
("Sluice listening on http://HOST:PORT"). Extra flags can be given in $SLUICE_SERVE_ARGS.
"""

import os
import pathlib
import queue
import re
import shlex
import signal
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.request

import openai
import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
MODEL_DIR = REPO / "models" / "sluice-mini-moe"
MODEL_NAME = "sluice-mini-moe"
READY_RE = re.compile(r"Sluice listening on (https?://[^\s:]+:(\d+))")
STARTUP_TIMEOUT_S = float(os.environ.get("SLUICE_STARTUP_TIMEOUT", "600"))


def sluice_bin() -> str:
    path = os.environ.get("SLUICE_BIN", str(REPO / "build" / "bin" / "sluice"))
    if not os.path.isabs(path):
        path = str(REPO / path)
    return path


class ServerProcess:
    """A running `sluice serve`; `url` is its base URL."""

    def __init__(self, extra_args=(), model_dir=MODEL_DIR, ca_file=None):
        # ca_file: the CA that signed --tls-cert (HTTPS health checks trust it).
        self.ca_file = ca_file
        binary = sluice_bin()
        if not os.path.exists(binary):
            raise RuntimeError(f"sluice binary not found at {binary} (set SLUICE_BIN)")
        self.log = tempfile.NamedTemporaryFile(prefix="sluice-serve-", suffix=".log", delete=False)
        args = [binary, "serve", "--model", str(model_dir), "--host", "127.0.0.1", "--port", "0"]
        args += shlex.split(os.environ.get("SLUICE_SERVE_ARGS", "")) + list(extra_args)
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self.log, text=True)
        lines: "queue.Queue[str]" = queue.Queue()

        def pump():
            for line in self.proc.stdout:
                lines.put(line)

        threading.Thread(target=pump, daemon=True).start()
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        self.url = None
        while self.url is None:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sluice serve exited with {self.proc.returncode}:\n{self.logs()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"sluice serve not ready after {STARTUP_TIMEOUT_S}s:\n{self.logs()}")
            try:
                match = READY_RE.search(lines.get(timeout=0.5))
            except queue.Empty:
                continue
            if match:
                self.url = match.group(1)
                self.port = int(match.group(2))
        self._wait_healthy(deadline)

    def _wait_healthy(self, deadline):
        while time.monotonic() < deadline:
            try:
                context = ssl.create_default_context(cafile=self.ca_file) if self.ca_file else None
                with urllib.request.urlopen(self.url + "/health", timeout=5,
                                            context=context) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"/health never answered 200:\n{self.logs()}")

    def logs(self) -> str:
        self.log.flush()
        return pathlib.Path(self.log.name).read_text(errors="replace")[-8000:]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


@pytest.fixture(scope="session")
def server():
    proc = ServerProcess()
    yield proc
    code = proc.stop()
    assert code == 0, f"sluice serve exited with {code} on SIGTERM:\n{proc.logs()}"


@pytest.fixture(scope="session")
def base_url(server) -> str:
    return server.url


@pytest.fixture(scope="session")
def client(base_url) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url + "/v1", api_key="sk-unused", max_retries=0,
                         timeout=300)


@pytest.fixture(scope="session")
def model() -> str:
    return MODEL_NAME
