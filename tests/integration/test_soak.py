"""The soak's short version (bench/soak.py, issue 29): 1.5 minutes of mixed streaming and
non-streaming load with client disconnects on router + 2 prefill + 2 decode + kvstore, a worker
killed (-9) or terminated and restarted every 20 s. Every request completes, is dropped by its
client on purpose, or gets a clean OpenAI error; none hangs; every worker's KV blocks come back
to zero in use; the router's and the kvstore's file descriptors and threads do not grow."""

import json
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_short_soak(tmp_path):
    out = tmp_path / "soak.json"
    run = subprocess.run([sys.executable, str(REPO / "bench" / "soak.py"), "--minutes", "1.5",
                          "--chaos-interval-s", "20", "--clients", "4", "--sample-s", "5",
                          "--out", str(out)], capture_output=True, text=True, timeout=900)
    assert out.exists(), run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(out.read_text())
    outcomes = result["outcomes"]
    assert run.returncode == 0, (outcomes, result["unclean_examples"], run.stderr[-3000:])
    assert outcomes["hang"] == 0 and outcomes["unclean"] == 0, result["unclean_examples"]
    assert outcomes["ok"] >= 20 and outcomes["disconnect"] >= 1, outcomes
    assert len(result["chaos_events"]) >= 3
    assert not any("error" in e for e in result["chaos_events"]), result["chaos_events"]
    assert result["kv_blocks_back_to_zero"] is True
    for name in ("router", "kvstore"):
        g = result["growth_never_restarted"][name]
        # Connections to restarted workers are replaced, not leaked.
        assert g["fds"] <= 4 and g["threads"] <= 4, (name, g)
    assert (out.with_suffix(".png")).stat().st_size > 10_000
