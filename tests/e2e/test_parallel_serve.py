"""`sluice serve` with several ranks (issue 4): --tensor-parallel-size / --expert-parallel-size
load the model with LoadCpuParallelModel (ranks as threads) and must answer the same greedy text
as the single-rank server; a layout the model cannot take is a start-up error (exit 2).

models/sluice-mini-moe is DeepSeek-V3-shaped: 6 attention heads (TP 2, 3, 6 divide them; 4 does
not), 16 routed experts (EP 2, 4, 8, 16), intermediate_size 1024.
"""

import json
import pathlib
import subprocess
import urllib.request

import openai
import pytest

from conftest import MODEL_DIR, REPO, ServerProcess, sluice_bin
from ports import free_port

PROMPTS = [
    "The capital of France is",
    "Once upon a time, there was a",
    "def fibonacci(n):",
    "1, 2, 3, 4,",
]
MAX_TOKENS = 24


def greedy_texts(url, model):
    client = openai.OpenAI(base_url=url + "/v1", api_key="sk-unused", max_retries=0, timeout=120)
    out = []
    for prompt in PROMPTS:
        r = client.completions.create(model=model, prompt=prompt, max_tokens=MAX_TOKENS,
                                      temperature=0, extra_body={"ignore_eos": True})
        assert r.usage.completion_tokens == MAX_TOKENS
        out.append(r.choices[0].text)
    return out


@pytest.fixture(scope="module")
def reference(server, model):
    return greedy_texts(server.url, model)


@pytest.mark.parametrize("flags, layout", [
    (["--tensor-parallel-size", "2"], "TP=2: 3 of 6 attention heads per rank"),
    # EPLB with 2 redundant replicas (9 slots a rank), re-placed every 2 engine steps: experts
    # move between ranks while the prompts decode.
    (["--expert-parallel-size", "2", "--enable-eplb", "--eplb-step-interval", "2",
      "--num-redundant-experts", "2"], "EP=2: 9 of 16 routed experts per rank"),
    (["--tensor-parallel-size", "2", "--expert-parallel-size", "2"],
     "EP=2: 8 of 16 routed experts per rank"),
], ids=["tp2", "ep2-eplb", "tp2-ep2"])
def test_parallel_server_matches_single_rank(reference, model, flags, layout):
    proc = ServerProcess(extra_args=flags)
    try:
        texts = greedy_texts(proc.url, model)
    finally:
        code = proc.stop()
    logs = proc.logs()
    assert code == 0, logs
    assert "2 ranks as threads of this process" in logs and layout in logs, logs
    if "--enable-eplb" in flags:
        assert "EPLB: rebalanced experts" in logs, logs
    assert texts == reference


def test_local_deploy_two_ranks_per_worker(reference, model, tmp_path):
    """deploy/local/up.sh --tp 2 --ep 2: every prompt is prefilled on the prefill worker and its
    KV moves to the decode worker (only the engine's cache, rank 0's, travels; the decode
    worker's other rank must see it too), and the text still equals the single-rank server's."""
    port = free_port(span=2000)  # up.sh derives its other ports from PORT..PORT+1999
    run_dir = tmp_path / "run"
    up = subprocess.run(
        [str(REPO / "deploy/local/up.sh"), "--port", str(port), "--run-dir", str(run_dir),
         "--bin", sluice_bin(), "--timeout", "60", "--tp", "2", "--ep", "2",
         "--", "--num-kv-blocks", "256"], capture_output=True, text=True, timeout=90)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert "TP=2 EP=2" in up.stdout
        # Which router id each process got (the router numbers workers as they register).
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/workers", timeout=10) as r:
            ids = {w["address"]: w["id"] for w in json.load(r)["data"]}
        mapping = (run_dir / "workers").read_text().split("\n")
        assert mapping == [f"prefill-1 127.0.0.1:{port + 1101} {ids[f'127.0.0.1:{port + 1101}']}",
                           f"decode-1 127.0.0.1:{port + 1201} {ids[f'127.0.0.1:{port + 1201}']}",
                           ""], mapping
        for line in mapping[:2]:
            assert f"  {line}\n" in up.stdout, up.stdout
        texts = greedy_texts(f"http://127.0.0.1:{port}", model)
    finally:
        subprocess.run([str(REPO / "deploy/local/down.sh"), "--run-dir", str(run_dir)],
                       capture_output=True, timeout=60)
    for worker in ("prefill-1", "decode-1"):
        log = pathlib.Path(run_dir / f"{worker}.log").read_text()
        assert "TP=2: 3 of 6 attention heads per rank; EP=2: 8 of 16" in log, log[-4000:]
    assert texts == reference


@pytest.mark.parametrize("flags, message", [
    (["--tensor-parallel-size", "4"],
     "--tensor-parallel-size 4: num_attention_heads (6) is not divisible by the parallel size 4"),
    (["--expert-parallel-size", "3"],
     "--expert-parallel-size 3: n_routed_experts (16) + --num-redundant-experts (0) is not "
     "divisible by it"),
    (["--tensor-parallel-size", "2", "--expert-parallel-size", "4"],
     "--tensor-parallel-size 2 and --expert-parallel-size 4 differ"),
    (["--tensor-parallel-size", "0"], "--tensor-parallel-size 0: must be >= 1"),
    (["--enable-eplb", "--expert-parallel-size", "1"],
     "--enable-eplb needs --expert-parallel-size > 1"),
], ids=["tp4-heads", "ep3-experts", "tp-ep-differ", "tp0", "eplb-without-ep"])
def test_bad_layout_fails_at_startup(flags, message):
    result = subprocess.run(
        [sluice_bin(), "serve", "--model", str(MODEL_DIR), "--port", "0"] + flags,
        capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert message in result.stdout + result.stderr
