"""Loopback ports for tests that start services on fixed ports.

A port from bind(0) lies inside the kernel's ephemeral range, so between picking it and the
service's own bind the kernel may hand it to an outgoing connection (gRPC, UCX, HTTP clients)
as its source port, and the service then fails with "Address already in use". Ports below the
range are never picked that way."""

import os
import random
import socket
import time


def _ephemeral_range():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = map(int, f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


_handed_out = set()


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(span: int = 1) -> int:
    """A loopback port P such that P..P+span-1 are free now and outside the ephemeral range.

    span > 1 serves launchers that derive their other ports from one base (deploy/local/up.sh
    uses PORT..PORT+1999). Each returned block is handed out once per test process (pytest-xdist
    workers differ in pid)."""
    low, high = _ephemeral_range()
    lo, hi = (10000, low - span) if low > 10000 + span else (high + 1, 65536 - span)
    if hi < lo:
        raise RuntimeError(f"no room for {span} ports outside the ephemeral range {low}-{high}")
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    for _ in range(1000):
        port = rng.randint(lo, hi)
        block = range(port, port + span)
        if any(p in _handed_out for p in block):
            continue
        # A launcher with a base port binds only some of the block; checking the base and the
        # ports it derives is the caller's job (up.sh checks them), so check the base here and
        # sample the rest cheaply only when the block is small.
        if not _bindable(port) or (span <= 64 and not all(_bindable(p) for p in block)):
            continue
        _handed_out.update(block)
        return port
    raise RuntimeError(f"no free loopback port block of {span} in {lo}-{hi}")
