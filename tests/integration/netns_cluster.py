"""A Sluice cluster spread over Linux network namespaces on this machine (issue 22's multi-host
tests): router, prefill, decode workers and a kvstore shard each get their own namespace and
address, joined by veth pairs to a bridge in a hub namespace. The test process reaches every
service over one more veth from the root namespace. KV moves over UCX tcp (UCX_TLS=tcp), so it
crosses the veths like any other traffic; `cut`/`restore` take a service's link down and up,
`impair` adds latency and loss on it (tc netem, or a tbf shaper where the
kernel lacks sch_netem).

Needs root (CAP_NET_ADMIN + CAP_SYS_ADMIN) and iproute2: `available()` says why not otherwise.
"""

import json
import os
import shutil
import subprocess
import tempfile

from sluice_cluster import MODEL_DIR, STARTUP_TIMEOUT_S, Proc, http_get, sluice_bin, wait_until

UCX_ENV = {"UCX_TLS": "tcp,self", "UCX_NET_DEVICES": "eth0", "UCX_WARN_UNUSED_ENV_VARS": "n"}


def _ip(*args):
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def available():
    """None when namespaces can be made here, else the reason they cannot."""
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "iproute2 (ip, tc) is not installed"
    name = f"slprobe{os.getpid() % 100000}"
    result = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if result.returncode != 0:
        return f"ip netns add: {result.stderr.strip()} (needs root)"
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None


class NetnsCluster:
    """router + num_prefill prefill + num_decode decode (+ a kvstore shard when kvstore=True)."""

    def __init__(self, num_prefill=1, num_decode=2, kvstore=True, worker_args=(),
                 router_args=(), model_dir=MODEL_DIR):
        self.tag = f"sl{os.getpid() % 100000}"
        # 10.213.<pid-derived>.0/24: concurrent test processes do not collide.
        self.subnet = f"10.213.{os.getpid() % 250 + 1}"
        self.dir = tempfile.mkdtemp(prefix="sluice-netns-")
        self.hub = f"{self.tag}-hub"
        self.namespaces, self.links, self.addrs = [self.hub], {}, {}
        self.procs, self.http_urls = {}, {}
        try:
            self._topology(["router"] + [f"prefill-{i}" for i in range(num_prefill)] +
                           [f"decode-{i}" for i in range(num_decode)] +
                           (["kvstore"] if kvstore else []))
            self._start(num_prefill, num_decode, kvstore, worker_args, router_args, model_dir)
        except BaseException:
            self.stop()
            raise

    def _topology(self, names):
        _ip("netns", "add", self.hub)
        _ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
        for dev in ("br0", "lo"):
            _ip("-n", self.hub, "link", "set", dev, "up")
        for index, name in enumerate(names, start=1):
            ns, link = f"{self.tag}-{name}", f"v{index}"
            _ip("netns", "add", ns)
            self.namespaces.append(ns)
            _ip("-n", self.hub, "link", "add", link, "type", "veth", "peer", "name", "eth0",
                "netns", ns)
            _ip("-n", self.hub, "link", "set", link, "master", "br0", "up")
            self.addrs[name] = f"{self.subnet}.{index}"
            _ip("-n", ns, "addr", "add", f"{self.addrs[name]}/24", "dev", "eth0")
            for dev in ("eth0", "lo"):
                _ip("-n", ns, "link", "set", dev, "up")
            self.links[name] = link
        # The test process's own way in: root namespace <-> hub bridge.
        self.host_link = f"{self.tag}h"
        _ip("link", "add", self.host_link, "type", "veth", "peer", "name", "vh", "netns", self.hub)
        _ip("-n", self.hub, "link", "set", "vh", "master", "br0", "up")
        _ip("addr", "add", f"{self.subnet}.254/24", "dev", self.host_link)
        _ip("link", "set", self.host_link, "up")

    def _proc(self, name, args):
        env_args = [f"{k}={v}" for k, v in UCX_ENV.items()]
        self.procs[name] = Proc(name, ["ip", "netns", "exec", f"{self.tag}-{name}", "env",
                                       *env_args, sluice_bin(), *args], self.dir)

    def _start(self, num_prefill, num_decode, kvstore, worker_args, router_args, model_dir):
        router = self.addrs["router"]
        self.url = f"http://{router}:8000"
        self._proc("router", ["router", "--model", str(model_dir), "--host", router, "--port",
                              "8000", "--grpc-host", router, "--grpc-port", "7000",
                              "--lease-seconds", "3", "--max-lease-seconds", "5", *router_args])
        extra = []
        if kvstore:
            addr = self.addrs["kvstore"]
            self._proc("kvstore", ["kvstore", "--host", addr, "--port", "7300",
                                   "--metrics-host", addr, "--metrics-port", "7301",
                                   "--dram-bytes", "256M", "--dram-page-bytes", "16M",
                                   "--ssd-dir", os.path.join(self.dir, "kvstore-ssd"),
                                   "--ssd-bytes", "256M"])
            self.http_urls["kvstore"] = f"http://{addr}:7301"
            wait_until(lambda: http_get(self.http_urls["kvstore"] + "/health")[0] == 200,
                       STARTUP_TIMEOUT_S, "kvstore /health")
            extra = ["--kvstore", f"{addr}:7300"]
        for role, count in (("prefill", num_prefill), ("decode", num_decode)):
            for i in range(count):
                name = f"{role}-{i}"
                addr = self.addrs[name]
                self.http_urls[name] = f"http://{addr}:9000"
                self._proc(name, [role, "--model", str(model_dir), "--listen", f"{addr}:7100",
                                  "--router", f"{router}:7000", "--http-host", addr,
                                  "--http-port", "9000", *extra, *worker_args])
        self.wait_registered(num_prefill, num_decode)

    def wait_registered(self, num_prefill, num_decode):
        def ready():
            for proc in self.procs.values():
                if proc.proc.poll() is not None:
                    raise RuntimeError(f"{proc.name} exited:\n{proc.tail()}")
            status, body = http_get(self.url + "/v1/workers")
            if status != 200:
                return False
            live = [w for w in json.loads(body)["data"] if not w["draining"] and
                    not w.get("suspect")]
            return (sum(w["role"] == "prefill" for w in live) == num_prefill and
                    sum(w["role"] == "decode" for w in live) == num_decode and
                    http_get(self.url + "/health")[0] == 200)
        wait_until(ready, STARTUP_TIMEOUT_S, f"{num_prefill} prefill + {num_decode} decode "
                   "registered across namespaces")

    def metrics_text(self, name):
        return http_get(self.http_urls[name] + "/metrics")[1]

    def cut(self, name):
        _ip("-n", self.hub, "link", "set", self.links[name], "down")

    def restore(self, name):
        _ip("-n", self.hub, "link", "set", self.links[name], "up")

    def impair(self, name):
        """Latency and loss on the hub side of `name`'s link (traffic towards it): tc netem
        (20 ms +- 5 ms, 1% loss) where the kernel has sch_netem; else a tbf shaper (20 Mbit/s,
        30 ms queue): queueing delay under load, and tail drops past the queue. Returns the
        qdisc used."""
        dev = self.links[name]
        for spec in (["netem", "delay", "20ms", "5ms", "loss", "1%"],
                     ["tbf", "rate", "20mbit", "burst", "32kb", "latency", "30ms"]):
            result = subprocess.run(["ip", "netns", "exec", self.hub, "tc", "qdisc", "replace",
                                     "dev", dev, "root", *spec], capture_output=True, text=True,
                                    timeout=30)
            if result.returncode == 0:
                return " ".join(spec)
            if "unknown" not in result.stderr:
                raise RuntimeError(f"tc {' '.join(spec)}: {result.stderr.strip()}")
        raise RuntimeError("tc: neither netem nor tbf is available")

    def unimpair(self, name):
        subprocess.run(["ip", "netns", "exec", self.hub, "tc", "qdisc", "del", "dev",
                        self.links[name], "root"], capture_output=True, timeout=30)

    def logs(self):
        return "\n".join(f"--- {name}\n{p.tail(40)}" for name, p in self.procs.items())

    def stop(self):
        for proc in self.procs.values():
            proc.stop()
        subprocess.run(["ip", "link", "del", getattr(self, "host_link", "")],
                       capture_output=True)
        for ns in reversed(self.namespaces):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
