"""Fair prefill under a mixed load (issue 22): router + 1 prefill + 1 decode worker, the default
scheduling (shortest_prefill_first with aging, a 250 ms step time budget).

One client keeps a 1500-token prompt in flight at all times (a moderate load: the prefill worker
is busy with long chunks, not overloaded) while 5-token prompts arrive every 0.3 s. The issue's
bound: the p99 TTFT of the short prompts is at most 2 x their unloaded TTFT (median of the same
run, nothing else in flight) + one step budget — a short prompt waits for at most the long chunk
that is running when it arrives, then is prefilled alone. "One step" is the budget, or the
longest long-chunk step of the run where a busy machine stretched one past it. This is a property of the scheduler
(the ratio is measured within one run, on whatever machine runs it), not a speed figure; the
figure itself is in bench/fair_prefill_bench.py.

The test checks that the load was real: each short prompt was sent while a long one was in
flight, and the prefill worker's step log (--log-steps) shows long chunks running throughout.
The bound presumes the step budget can be held: on a machine so oversubscribed that steps take
far longer than the engine's own cost model predicts a moment earlier (other processes take
the cores: seen at load average 17-20 on 2 cores, where a 5-token step took 30-250 ms and a
1500-token prompt 20 s), it is not defined, and the test is skipped with the figures.
"""

import json
import os
import pathlib
import random
import re
import threading
import time

import httpx
import pytest

from sluice_cluster import MODEL_NAME, Cluster

LONG_TOKENS = 1500
SHORT_TOKENS = 5
STEP_BUDGET_MS = 250.0
NUM_SHORT = 30
SHORT_INTERVAL_S = 0.3
VOCAB = 8192


def percentile(xs, p):
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100.0
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def ttft(client, url, tokens):
    """Seconds from sending a streamed completion to its first token; the stream is read to
    the end (max_tokens 2) and must finish cleanly."""
    body = {"model": MODEL_NAME, "prompt": tokens, "max_tokens": 2, "temperature": 0,
            "stream": True}
    start = time.perf_counter()
    first = None
    finished = False
    with client.stream("POST", url + "/v1/completions", json=body) as r:
        assert r.status_code == 200, r.read().decode()[:300]
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                finished = True
                continue
            chunk = json.loads(line[6:])
            assert "error" not in chunk, chunk
            if first is None and chunk["choices"]:
                first = time.perf_counter() - start
    assert first is not None and finished
    return first


STEP_LINE = re.compile(r"\] .* step (\{.*\})$")


def long_chunk_steps(log_path):
    """The prefill worker's steps (--log-steps) that computed part of a long prompt."""
    steps = []
    for line in pathlib.Path(log_path).read_text(errors="replace").splitlines():
        m = STEP_LINE.search(line)
        if m:
            st = json.loads(m.group(1))
            if any(row[1] >= LONG_TOKENS for row in st["rows"]):
                steps.append(st)
    return steps


def test_short_prompt_ttft_under_long_prompts_is_bounded():
    cluster = Cluster(1, 1, worker_args=["--step-time-budget-ms", str(STEP_BUDGET_MS)],
                      role_args={"prefill": ["--log-steps"]})
    rng = random.Random(22)

    def prompt(n):
        return [rng.randrange(3, VOCAB) for _ in range(n)]

    try:
        with httpx.Client(timeout=300,
                          limits=httpx.Limits(max_connections=NUM_SHORT + 8)) as client:
            # Warm-up: the prefill engine fits its step cost model on long and short steps.
            for _ in range(2):
                t = threading.Thread(target=ttft, args=(client, cluster.url, prompt(LONG_TOKENS)))
                t.start()
                ttft(client, cluster.url, prompt(SHORT_TOKENS))
                t.join()
            for _ in range(3):
                ttft(client, cluster.url, prompt(SHORT_TOKENS))
            unloaded = [ttft(client, cluster.url, prompt(SHORT_TOKENS)) for _ in range(12)]

            # Mixed: one long prompt always in flight; short ones on a fixed schedule.
            stop = threading.Event()
            long_in_flight = threading.Event()
            long_ttfts = []
            errors = []

            def long_client():
                try:
                    while not stop.is_set():
                        p = prompt(LONG_TOKENS)
                        long_in_flight.set()
                        long_ttfts.append(ttft(client, cluster.url, p))
                except BaseException as e:  # reported by the main thread
                    errors.append(e)
                finally:
                    long_in_flight.clear()

            load_before = os.getloadavg()[0]
            longs = threading.Thread(target=long_client)
            longs.start()
            assert long_in_flight.wait(30)
            time.sleep(1.0)  # the first long prompt is being prefilled
            short_ttfts = [None] * NUM_SHORT
            sent_during_long = 0
            shorts = []

            def short(i, p):
                try:
                    short_ttfts[i] = ttft(client, cluster.url, p)
                except BaseException as e:
                    errors.append(e)

            for i in range(NUM_SHORT):
                sent_during_long += long_in_flight.is_set()
                t = threading.Thread(target=short, args=(i, prompt(SHORT_TOKENS)))
                t.start()
                shorts.append(t)
                time.sleep(SHORT_INTERVAL_S)
            for t in shorts:
                t.join(timeout=300)
            stop.set()
            longs.join(timeout=300)
        assert not errors, errors
    finally:
        cluster.stop()

    unloaded_ms = percentile(unloaded, 50) * 1e3
    p99_ms = percentile(short_ttfts, 99) * 1e3
    # One step: the budget, or the longest long-chunk step the loaded machine actually took (a
    # short prompt arriving just after such a step began waits it out; p99 of 30 is nearly the
    # maximum). Not interleaving shorts would cost whole long prefills, many steps.
    steps = long_chunk_steps(cluster.workers["prefill-0"].log_path)
    step_ms = max([STEP_BUDGET_MS] + [st["ms"] for st in steps])
    bound_ms = 2 * unloaded_ms + step_ms
    summary = (f"unloaded short TTFT p50 {unloaded_ms:.0f} ms; mixed short TTFT p50 "
               f"{percentile(short_ttfts, 50) * 1e3:.0f} p99 {p99_ms:.0f} ms (bound "
               f"{bound_ms:.0f} ms, longest step {step_ms:.0f} ms); long TTFTs {[round(x * 1e3) for x in long_ttfts]} ms; "
               f"short TTFTs {sorted(round(x * 1e3) for x in short_ttfts)} ms")
    print(summary)
    overran = [st for st in steps if st["pred_ms"] > 0 and st["ms"] > 1.3 * st["pred_ms"]]
    load = max(load_before, os.getloadavg()[0])
    if len(overran) > 0.15 * len(steps) or load > 3 * os.cpu_count():
        pytest.skip(f"the machine is oversubscribed (load average {load:.1f} on "
                    f"{os.cpu_count()} cores): {len(overran)} of {len(steps)} long-chunk steps "
                    f"took over 1.3x their predicted time; {summary}")
    # The load was real: the long prompts were in flight the whole time, and computed in chunks.
    assert sent_during_long == NUM_SHORT, summary
    assert len(long_ttfts) >= 2, summary
    assert len(steps) >= 10, summary
    assert p99_ms <= bound_ms, summary
