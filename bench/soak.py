#!/usr/bin/env python3
"""Soak (issue 29): mixed load with client disconnects and worker restarts, bounded in time.

Cluster: `sluice router` + 2 prefill + 2 decode + a `sluice kvstore` shard (prefill writes
through to it), sluice-mini-moe on the CPU by default.
Load: --clients threads, each sending requests back to back until the end: half streamed, half
not; prompts from a pool with shared prefixes (prefix cache and kvstore hits); max_tokens
4..--max-tokens; --disconnect-rate of the streams is dropped by the client after a few chunks.
Chaos: every --chaos-interval-s one worker (prefill or decode, in turn) gets kill -9 or SIGTERM
(alternating) and is started again on the same ports.
Sampled every --sample-s for every process: RSS, open file descriptors, threads (/proc), and
each worker's KV blocks in use (/metrics).

Outcome of every request: ok, a clean error (an HTTP error with an OpenAI error body: the status
is recorded), a client disconnect (intended), or a hang (no answer within --request-timeout-s).
Reported: the outcome counts, per-minute samples per process, the growth from the first minute
to the end for the processes never restarted (router, kvstore), and whether every worker's KV
blocks came back to zero in use at the end. Exit status 1 on any hang, any unclean failure or
blocks left in use. The PNG shows the four series over time with the chaos events.

Usage: .venv/bin/python bench/soak.py --minutes 30 --out bench/results/soak_cpu.json
       (tests/integration/test_soak.py runs a 1.5-minute version in CI)
$SLUICE_BIN picks the binary (default build/bin/sluice).
"""
import argparse
import json
import os
import pathlib
import random
import signal
import sys
import tempfile
import threading
import time

import openai

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))
from sluice_cluster import (MODEL_NAME, Cluster, KvStore, http_get, sum_samples,  # noqa: E402
                            wait_until)

TOPICS = ["rivers", "trees", "bridges", "stars", "ships", "birds", "mountains", "cities"]


def prompt(rng):
    """Shared prefixes (a topic's long preamble) with a distinct tail."""
    topic = rng.choice(TOPICS)
    preamble = f"You are a patient teacher. Today's lesson is about {topic}. " * 6
    return [{"role": "system", "content": preamble},
            {"role": "user", "content": f"Question {rng.randrange(10**6)}: tell me about {topic}."}]


def proc_stats(pid):
    try:
        status = pathlib.Path(f"/proc/{pid}/status").read_text()
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        return {"rss_mb": round(int(fields["VmRSS"].split()[0]) / 1024, 1),
                "threads": int(fields["Threads"]),
                "fds": len(os.listdir(f"/proc/{pid}/fd"))}
    except (OSError, KeyError, ValueError):
        return None  # exited between listing and reading


class Soak:
    def __init__(self, args):
        self.args = args
        self.rng = random.Random(args.seed)
        self.dir = tempfile.mkdtemp(prefix="sluice-soak-")
        self.store = KvStore(self.dir)
        self.cluster = Cluster(2, 2, router_args=["--suspect-grace-s", "5"],
                               role_args={"prefill": ["--kvstore", self.store.address],
                                          "decode": ["--drain-timeout-s", "2"]})
        self.lock = threading.Lock()
        self.outcomes = {"ok": 0, "disconnect": 0, "clean_error": 0, "hang": 0, "unclean": 0}
        self.error_statuses, self.unclean = {}, []
        self.samples, self.events = [], []
        self.begin = time.monotonic()
        self.stop = threading.Event()

    def now(self):
        return round(time.monotonic() - self.begin, 2)

    def processes(self):
        procs = {"router": self.cluster.router, "kvstore": self.store.proc,
                 **self.cluster.workers}
        return {name: p.proc.pid for name, p in procs.items() if p.proc.poll() is None}

    def record(self, outcome, detail=None):
        with self.lock:
            self.outcomes[outcome] += 1
            if outcome == "clean_error":
                self.error_statuses[detail] = self.error_statuses.get(detail, 0) + 1
            elif outcome == "unclean" and len(self.unclean) < 20:
                self.unclean.append(detail)

    def one_request(self, client, rng):
        streamed = rng.random() < 0.5
        max_tokens = rng.randint(4, self.args.max_tokens)
        kwargs = dict(model=MODEL_NAME, messages=prompt(rng), max_tokens=max_tokens,
                      temperature=rng.choice([0, 0.8]), seed=rng.randrange(1000))
        try:
            if not streamed:
                r = client.chat.completions.create(**kwargs)
                ok = r.choices[0].finish_reason in ("stop", "length")
                self.record("ok" if ok else "unclean", f"finish {r.choices[0].finish_reason}")
                return
            drop_after = (rng.randint(1, 4) if rng.random() < self.args.disconnect_rate
                          else None)
            stream = client.chat.completions.create(stream=True, **kwargs)
            chunks, finish = 0, None
            for chunk in stream:
                chunks += 1
                if chunk.choices:
                    finish = chunk.choices[0].finish_reason or finish
                if drop_after is not None and chunks >= drop_after:
                    stream.close()  # the client goes away mid-stream
                    self.record("disconnect")
                    return
            self.record("ok" if finish in ("stop", "length") else "unclean",
                        f"stream ended with finish_reason {finish}")
        except openai.APITimeoutError:
            self.record("hang")
        except openai.APIStatusError as e:
            body_ok = isinstance(e.body, dict) and "message" in e.body
            self.record("clean_error" if body_ok else "unclean",
                        e.status_code if body_ok else f"{e.status_code} {e.body!r}")
        except openai.APIConnectionError as e:
            self.record("unclean", f"connection: {e}")
        except openai.APIError as e:  # an error event inside the stream
            self.record("clean_error", f"stream error: {str(e)[:80]}")

    def client_loop(self, index):
        rng = random.Random(self.args.seed * 1000 + index)
        client = openai.OpenAI(base_url=self.cluster.url + "/v1", api_key="x", max_retries=0,
                               timeout=self.args.request_timeout_s)
        while not self.stop.is_set():
            self.one_request(client, rng)

    def chaos_loop(self):
        victims = ["prefill-0", "decode-0", "prefill-1", "decode-1"]
        n = 0
        while not self.stop.wait(self.args.chaos_interval_s):
            name = victims[n % len(victims)]
            sig = signal.SIGKILL if n % 2 == 0 else signal.SIGTERM
            n += 1
            proc = self.cluster.workers[name]
            self.events.append({"t": self.now(), "worker": name, "signal": sig.name})
            proc.proc.send_signal(sig)
            try:
                proc.proc.wait(timeout=30)
            except Exception:
                proc.proc.kill()
                proc.proc.wait(timeout=10)
            proc.log.close()
            proc.start()
            try:
                self.cluster.wait_registered(2, 2, timeout=120)
            except RuntimeError as e:
                self.events.append({"t": self.now(), "worker": name, "error": str(e)[:300]})

    def kv_in_use(self, name):
        try:
            text = self.cluster.worker_metrics_text(name)
        except OSError:
            return None
        return int(sum_samples(text, "sluice_kv_cache_blocks") -
                   sum_samples(text, "sluice_kv_cache_free_blocks"))

    def sample(self):
        t = self.now()
        for name, pid in self.processes().items():
            stats = proc_stats(pid)
            if stats is None:
                continue
            row = {"t": t, "process": name, "pid": pid, **stats}
            if name in self.cluster.workers:
                row["kv_blocks_in_use"] = self.kv_in_use(name)
            self.samples.append(row)

    def sample_loop(self):
        while not self.stop.wait(self.args.sample_s):
            self.sample()

    def run(self):
        self.sample()
        threads = [threading.Thread(target=self.client_loop, args=(i,), daemon=True)
                   for i in range(self.args.clients)]
        threads += [threading.Thread(target=self.chaos_loop, daemon=True),
                    threading.Thread(target=self.sample_loop, daemon=True)]
        for th in threads:
            th.start()
        time.sleep(self.args.minutes * 60)
        self.stop.set()
        for th in threads:
            th.join(timeout=self.args.request_timeout_s + 60)
        hung_threads = sum(th.is_alive() for th in threads)
        self.cluster.wait_registered(2, 2, timeout=120)
        names = list(self.cluster.workers)
        try:
            wait_until(lambda: all(self.kv_in_use(n) == 0 for n in names), 60,
                       "KV blocks back to zero in use")
            blocks_back = True
        except RuntimeError:
            blocks_back = False
        self.sample()
        return hung_threads, blocks_back

    def close(self):
        self.cluster.stop()
        self.store.proc.stop()


def per_minute(samples):
    """The last sample of each process in each minute."""
    rows = {}
    for s in samples:
        rows[(s["process"], int(s["t"] // 60))] = s
    return [dict(r, minute=m) for (_, m), r in sorted(rows.items(), key=lambda kv: kv[0][::-1])]


def growth(samples, name):
    """End minus the end of the first minute (or the first sample) for one never-restarted
    process: RSS MiB, FDs and threads."""
    rows = [s for s in samples if s["process"] == name]
    if not rows:
        return None
    first = [s for s in rows if s["t"] <= 60][-1] if rows[0]["t"] <= 60 else rows[0]
    last = rows[-1]
    return {k: round(last[k] - first[k], 1) for k in ("rss_mb", "fds", "threads")} | {
        "from_t": first["t"], "to_t": last["t"]}


def plot(samples, events, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2, 2, figsize=(13, 8), sharex=True)
    series = [("rss_mb", "RSS (MiB)"), ("fds", "open file descriptors"), ("threads", "threads"),
              ("kv_blocks_in_use", "KV blocks in use")]
    names = sorted({s["process"] for s in samples})
    colors = {name: f"C{i}" for i, name in enumerate(names)}  # one color per process everywhere
    for ax, (key, title) in zip(axes.flat, series):
        for name in names:
            pts = [(s["t"] / 60, s[key]) for s in samples
                   if s["process"] == name and s.get(key) is not None]
            if pts:
                ax.plot(*zip(*pts), label=name, color=colors[name], linewidth=1)
        for e in events:
            ax.axvline(e["t"] / 60, color="grey", alpha=0.3, linewidth=0.8)
        ax.set_title(title)
        ax.set_xlabel("minutes (grey: a worker killed or terminated, then restarted)")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--clients", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--disconnect-rate", type=float, default=0.15)
    ap.add_argument("--chaos-interval-s", type=float, default=60)
    ap.add_argument("--sample-s", type=float, default=10)
    ap.add_argument("--request-timeout-s", type=float, default=120)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=pathlib.Path, default=REPO / "bench/results/soak_cpu.json")
    ap.add_argument("--plot", type=pathlib.Path, default=None, help="default: --out with .png")
    args = ap.parse_args()
    soak = Soak(args)
    try:
        hung_threads, blocks_back = soak.run()
    finally:
        soak.close()
    result = {
        "bench": "soak", "minutes": args.minutes, "clients": args.clients,
        "chaos_interval_s": args.chaos_interval_s, "command": sys.argv,
        "machine": {"cores": os.cpu_count(), "load_average_at_end": os.getloadavg()},
        "outcomes": soak.outcomes, "error_statuses": {str(k): v for k, v in
                                                      soak.error_statuses.items()},
        "unclean_examples": soak.unclean, "hung_client_threads": hung_threads,
        "kv_blocks_back_to_zero": blocks_back, "chaos_events": soak.events,
        "growth_never_restarted": {n: growth(soak.samples, n) for n in ("router", "kvstore")},
        "per_minute": per_minute(soak.samples), "logs": soak.cluster.dir,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    plot(soak.samples, soak.events, args.plot or args.out.with_suffix(".png"))
    print(json.dumps({k: result[k] for k in ("outcomes", "error_statuses", "hung_client_threads",
                                             "kv_blocks_back_to_zero",
                                             "growth_never_restarted")}, indent=1))
    failed = (soak.outcomes["hang"] or soak.outcomes["unclean"] or hung_threads or
              not blocks_back)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
