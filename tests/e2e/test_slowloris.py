"""A slowloris against `sluice serve`: many connections trickle a request head one byte at a time
while real clients (the official `openai` SDK) are served; the server cuts every trickling
connection at --http-request-timeout-s.

CI opens 300 connections; SLUICE_SLOWLORIS_CONNECTIONS=1000 runs the full figure.
"""

import os
import resource
import socket
import threading
import time

import openai

from conftest import MODEL_NAME, ServerProcess

NUM_SLOW = int(os.environ.get("SLUICE_SLOWLORIS_CONNECTIONS", "300"))
REQUEST_TIMEOUT_S = 30


def test_trickling_connections_do_not_starve_real_requests():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, NUM_SLOW + 512)), hard))
    proc = ServerProcess(extra_args=["--http-request-timeout-s", str(REQUEST_TIMEOUT_S)])
    try:
        host, port = "127.0.0.1", proc.port
        slow = []
        for _ in range(NUM_SLOW):
            s = socket.create_connection((host, port), timeout=10)
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            slow.append(s)
        opened_at = time.monotonic()
        stop = threading.Event()
        closed_by_server = set()

        def trickle():
            # One byte per connection every 0.5 s: the head never completes.
            while not stop.is_set():
                for i, s in enumerate(slow):
                    if i in closed_by_server:
                        continue
                    try:
                        s.send(b"a")
                    except OSError:
                        closed_by_server.add(i)
                stop.wait(0.5)

        trickler = threading.Thread(target=trickle, daemon=True)
        trickler.start()
        client = openai.OpenAI(base_url=proc.url + "/v1", api_key="x", max_retries=0, timeout=30)
        for i in range(3):
            out = client.completions.create(model=MODEL_NAME, prompt=f"Count {i}:", max_tokens=4,
                                            extra_body={"ignore_eos": True},
                                            temperature=0)
            assert out.usage.completion_tokens == 4
        # The real requests were served while every slow connection was still held open.
        still_open = NUM_SLOW - len(closed_by_server)
        served_before_deadline = time.monotonic() - opened_at < REQUEST_TIMEOUT_S
        # Every trickling connection is closed at its deadline (a recv sees EOF or a reset).
        stop.set()
        trickler.join()
        deadline = opened_at + REQUEST_TIMEOUT_S + 20
        for s in slow:
            s.settimeout(max(0.1, deadline - time.monotonic()))
            try:
                while s.recv(4096):
                    pass
            except ConnectionResetError:
                pass
            s.close()
        assert time.monotonic() < deadline + 1
        assert still_open == NUM_SLOW
        assert served_before_deadline, "the real requests waited for the slow connections"
        # And the server still serves.
        assert client.models.list().data[0].id == MODEL_NAME
    finally:
        assert proc.stop() == 0, proc.logs()
