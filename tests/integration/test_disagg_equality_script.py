"""bench/gpu_disagg_equality.py's SWA bounded replay checks (--swa-replay-tokens), run on the CPU
engine (--device cpu, the script's own smoke mode) with qwen3-hybrid-tiny (2 sliding layers of
window 16, 2 full-attention layers; exactness bound 31): the GPU runs of
scripts/gpu_disagg_runs.sh use the same code path with --device cuda.

The report must show every request's replay (min(R, prompt tokens) replayed tokens each), no
recompute, exactly the full-attention layers' share of the prompt blocks moved (2 of 4 layers,
float32: 2 x 2 KV heads x 16 dims x 4 bytes per layer and token), and tokens equal to
`sluice serve`'s."""

import json
import subprocess
import sys

import pytest

from sluice_cluster import REPO

MODEL = (REPO.parent / "shared" / "fixtures" / "qwen3-hybrid-tiny").resolve()

pytestmark = pytest.mark.skipif(not MODEL.is_dir(), reason=f"{MODEL} missing")


@pytest.mark.parametrize("mode", ["pull", "push"])
def test_replay_checks_pass_on_cpu(tmp_path, mode):
    out = tmp_path / "report.json"
    run = subprocess.run(
        [sys.executable, str(REPO / "bench" / "gpu_disagg_equality.py"), "--model", str(MODEL),
         "--device", "cpu", "--mode", mode, "--requests", "6", "--sequential", "3",
         "--max-tokens", "6", "--swa-replay-tokens", "31", "--out", str(out)],
        capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    report = json.loads(out.read_text())
    assert report["ok"] and report["swa_replay_tokens"] == 31
    assert report["swa_exact_replay_tokens"] == 31
    assert report["num_mismatches"] == 0 and report["sequential_mismatches"] == []
    swa = report["swa"]
    assert swa["ok"] and swa["transfers_recomputed"] == 0
    # 6 concurrent + 2 passes of 3 sequential requests, each replaying min(31, prompt tokens).
    assert swa["replayed_tokens"] == swa["expected_replayed_tokens"] > 12 * 6
    assert swa["kv_bytes_moved"] == swa["expected_kv_bytes_moved"] > 0
    assert swa["kv_bytes_moved"] % (16 * 2 * (2 * 2 * 16 * 4)) == 0  # whole blocks, 2 layers

