"""A worker started on a gRPC address another process already listens on must fail to start,
not share the port: gRPC binds with SO_REUSEPORT unless told otherwise, and two decode workers
on one address made the router's registry replace one with the other every heartbeat."""
import subprocess

from sluice_cluster import MODEL_DIR, Cluster, Proc, free_port, sluice_bin, wait_until


def test_a_second_worker_on_a_taken_grpc_port_exits_instead_of_sharing_it():
    cluster = Cluster(num_prefill=0, num_decode=1)
    try:
        first = cluster.workers["decode-0"]
        listen = first.args[first.args.index("--listen") + 1]
        second = Proc("decode-dup", [
            sluice_bin(), "decode", "--model", str(MODEL_DIR), "--listen", listen,
            "--router", f"127.0.0.1:{cluster.grpc_port}", "--http-port", str(free_port())],
            cluster.dir)
        try:
            rc = second.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"a second decode worker started on {listen}:\n{second.tail()}")
        finally:
            second.stop()
        assert rc != 0, second.tail()
        assert listen in second.tail(), second.tail()
        # The first worker is untouched: still the one registered, under its address.
        assert first.proc.poll() is None
        wait_until(lambda: cluster.addresses("decode") == {listen}, 10, "decode-0 registered")
    finally:
        cluster.stop()
