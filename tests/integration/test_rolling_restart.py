"""Rolling restart under load (issue 22): router + 2 prefill + 2 decode workers; while clients
stream requests back to back, each worker in turn gets SIGTERM (drain, deregister, exit 0) and
is started again at the same address, and the next one goes only once it registered again.

Every request completes with the text of the undisturbed run (greedy), none fails; the router
counts no worker failure; afterwards every worker is back to baseline: all KV blocks free, no
pinned prefill block, no decode reservation or session left.
"""

import concurrent.futures
import signal
import threading

from sluice_cluster import Cluster, sum_samples, wait_until
from test_faults import Reference, client_for, stream

N_CLIENTS = 4
MAX_TOKENS = 24


def test_rolling_restart_of_every_worker_fails_nothing():
    reference = Reference()
    try:
        reference.warm([(i, MAX_TOKENS) for i in range(N_CLIENTS * 8)])
    finally:
        reference.serve.stop()
    cluster = Cluster(num_prefill=2, num_decode=2, worker_args=["--drain-timeout-s", "10"])
    try:
        client = client_for(cluster.url)
        stop = threading.Event()
        results = []  # (request index, (text, finish, usage)) or (index, exception)
        lock = threading.Lock()

        def client_loop(c):
            k = 0
            while not stop.is_set():
                i = (c * 8 + k) % (N_CLIENTS * 8)
                k += 1
                try:
                    out = stream(client, i, MAX_TOKENS)
                except Exception as e:  # noqa: BLE001 - every failure is reported below
                    out = e
                with lock:
                    results.append((i, out))

        with concurrent.futures.ThreadPoolExecutor(N_CLIENTS) as pool:
            loops = [pool.submit(client_loop, c) for c in range(N_CLIENTS)]
            wait_until(lambda: len(results) >= N_CLIENTS, 120, "load under way")
            for name in ("prefill-0", "prefill-1", "decode-0", "decode-1"):
                worker = cluster.workers[name]
                before = len(results)
                worker.proc.send_signal(signal.SIGTERM)
                assert worker.proc.wait(timeout=60) == 0, worker.tail()
                worker.log.close()
                worker.start()  # same flags, same address
                cluster.wait_registered(2, 2, timeout=120)
                # Some requests ran on the restarted pool before the next worker goes.
                wait_until(lambda: len(results) >= before + N_CLIENTS, 120,
                           f"requests after restarting {name}")
            stop.set()
            for f in loops:
                f.result(timeout=600)
        failed = [(i, out) for i, out in results if isinstance(out, Exception)]
        assert not failed, f"{len(failed)} of {len(results)} failed, e.g. {failed[0]}"
        wrong = [(i, out) for i, out in results if out != reference[(i, MAX_TOKENS)]]
        assert not wrong, wrong[:2]
        assert cluster.metric("sluice_router_worker_failures_total") == 0
        # Nothing leaks: every worker back to baseline, the router idle. The workers publish
        # these after the requests' last outputs went out (a decode session ends after its
        # final message), hence the bounded wait.
        def at_baseline(name):
            text = cluster.worker_metrics_text(name)
            return (sum_samples(text, "sluice_kv_cache_free_blocks") ==
                    sum_samples(text, "sluice_kv_cache_blocks") and
                    sum_samples(text, "sluice_prefill_held_blocks") == 0 and
                    sum_samples(text, "sluice_decode_reserved_transfers") == 0 and
                    sum_samples(text, "sluice_decode_sessions") == 0)
        for name in cluster.workers:
            wait_until(lambda: at_baseline(name), 30, f"{name} back at baseline")
        print(f"\nrolling restart of 4 workers: {len(results)} requests, 0 failed")
    finally:
        cluster.stop()
