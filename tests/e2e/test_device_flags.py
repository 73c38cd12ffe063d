"""`--device` / `--load-format` / `--gpu-memory-utilization` of the engine commands.

CI has no GPU and may build with or without the CUDA backend (SLUICE_CUDA=AUTO), so the
`--device cuda` tests accept the one answer each build can give and check it exactly: a build
without the backend names the rebuild flag before anything else; a build with it rejects what
the backend does not support yet (usage errors, exit 2, before any model loads) and, on a machine
without a GPU, fails the load with a clear FailedPrecondition (exit 1).
"""

import json
import shutil
import subprocess

import pytest

from conftest import MODEL_DIR, sluice_bin

NO_BACKEND = ("INVALID_ARGUMENT: --device cuda: this build has no CUDA backend "
              "(rebuild with -DSLUICE_CUDA=ON)")


def run(*args, timeout=120):
    return subprocess.run([sluice_bin(), *args], capture_output=True, text=True, timeout=timeout)


def generate(tmp_path, *flags, model=MODEL_DIR, lines=None):
    src = tmp_path / "in.jsonl"
    lines = lines or [{"prompt": [0, 5, 6], "max_tokens": 2}]
    src.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return run("generate", "--model", str(model), "--input", str(src), "--output",
               str(tmp_path / "out.jsonl"), "--no-progress", *flags)


@pytest.fixture(scope="module")
def cuda_build(tmp_path_factory):
    """True when this binary has the CUDA backend (it then fails on the GPU, not the build)."""
    proc = generate(tmp_path_factory.mktemp("probe"), "--device", "cuda")
    assert proc.returncode != 0 or "engine ready on cuda" in proc.stderr, proc.stderr
    return NO_BACKEND not in proc.stderr


@pytest.mark.parametrize("flags,unsupported", [
    (["--tensor-parallel-size", "2"], "--tensor-parallel-size / --expert-parallel-size > 1"),
    (["--expert-parallel-size", "2"], "--tensor-parallel-size / --expert-parallel-size > 1"),
])
def test_cuda_unsupported_flags(tmp_path, cuda_build, flags, unsupported):
    proc = generate(tmp_path, "--device", "cuda", *flags)
    assert proc.returncode == 2, proc.stderr
    expected = (f"INVALID_ARGUMENT: --device cuda does not support {unsupported} yet"
                if cuda_build else NO_BACKEND)
    assert expected in proc.stderr


def test_cuda_batch_invariant_is_accepted(tmp_path, cuda_build):
    """`--batch-invariant` is no longer refused with --device cuda: a build with the backend
    gets past the flag checks to the GPU probe (no GPU in CI: FailedPrecondition, exit 1)."""
    if cuda_build and shutil.which("nvidia-smi") and run_ok(["nvidia-smi", "-L"]):
        pytest.skip("a GPU is present (cuda_model_test's *BatchInvariant* tests run the mode)")
    proc = generate(tmp_path, "--device", "cuda", "--batch-invariant")
    if not cuda_build:
        assert proc.returncode == 2, proc.stderr
        assert NO_BACKEND in proc.stderr
        return
    assert proc.returncode == 1, proc.stderr
    assert "does not support --batch-invariant" not in proc.stderr
    assert "FAILED_PRECONDITION: --device cuda: no CUDA GPU is visible (" in proc.stderr


def links_cuda_ucx():
    """True when the binary links the CUDA-aware UCX (libucx-cu13, cmake/ucx.cmake)."""
    out = subprocess.run(["ldd", sluice_bin()], capture_output=True, text=True).stdout
    return "ucx-cu13" in out


@pytest.mark.parametrize("command", ["prefill", "decode"])
def test_cuda_workers(cuda_build, command):
    """CUDA workers need the backend and a CUDA-aware UCX; then they load like sluice serve."""
    if cuda_build and links_cuda_ucx() and shutil.which("nvidia-smi") and \
            run_ok(["nvidia-smi", "-L"]):
        pytest.skip("a GPU is present (scripts/gpu_disagg_equality.sh runs CUDA workers)")
    proc = run(command, "--model", str(MODEL_DIR), "--device", "cuda", "--listen",
               "127.0.0.1:0")
    if not cuda_build:
        assert proc.returncode == 2, proc.stderr
        assert NO_BACKEND in proc.stderr
    elif not links_cuda_ucx():
        assert proc.returncode == 2, proc.stderr
        assert ("INVALID_ARGUMENT: --device cuda with prefill/decode KV transfer needs a "
                "CUDA-aware UCX") in proc.stderr
    else:
        assert proc.returncode == 1, proc.stderr
        assert "FAILED_PRECONDITION: --device cuda: no CUDA GPU is visible (" in proc.stderr


def test_cuda_kvstore_is_accepted(tmp_path, cuda_build):
    """--kvstore with --device cuda passes the flag checks (the GPU cache spills to the store);
    without a GPU the load then fails as any CUDA load does."""
    proc = generate(tmp_path, "--device", "cuda", "--kvstore", "127.0.0.1:1")
    if not cuda_build:
        assert proc.returncode == 2, proc.stderr
        assert NO_BACKEND in proc.stderr
        return
    if shutil.which("nvidia-smi") and run_ok(["nvidia-smi", "-L"]):
        pytest.skip("a GPU is present (cuda_model_test CudaKvstoreTest runs the kvstore path)")
    assert "does not support --kvstore" not in proc.stderr
    assert proc.returncode == 1, proc.stderr
    assert ("cannot load the model: FAILED_PRECONDITION: --device cuda: no CUDA GPU is visible ("
            in proc.stderr)


def test_cuda_without_gpu(tmp_path, cuda_build):
    if not cuda_build:
        pytest.skip("no CUDA backend in this build (test_cuda_unsupported_flags checks its error)")
    if shutil.which("nvidia-smi") and run_ok(["nvidia-smi", "-L"]):
        pytest.skip("a GPU is present")
    proc = generate(tmp_path, "--device", "cuda")
    assert proc.returncode == 1, proc.stderr
    assert ("cannot load the model: FAILED_PRECONDITION: --device cuda: no CUDA GPU is visible ("
            in proc.stderr)


def run_ok(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, timeout=30).returncode == 0
    except OSError:
        return False


@pytest.mark.parametrize("flags,message", [
    (["--device", "tpu"], "--device: invalid value 'tpu' (expected one of: cpu, cuda)"),
    (["--load-format", "pt"], "--load-format: invalid value 'pt' (expected one of: auto, dummy)"),
    (["--gpu-memory-utilization", "1.5"],
     "--gpu-memory-utilization: invalid value '1.5' (expected a number in [0, 1])"),
])
def test_bad_values(tmp_path, flags, message):
    proc = generate(tmp_path, *flags)
    assert (proc.returncode, proc.stderr) == (
        2, f"sluice: error: {message}\nRun 'sluice generate --help' for usage.\n")


def test_zero_gpu_memory_utilization(tmp_path, cuda_build):
    proc = generate(tmp_path, "--device", "cuda", "--gpu-memory-utilization", "0")
    assert proc.returncode == 2, proc.stderr
    expected = ("INVALID_ARGUMENT: --gpu-memory-utilization 0: must be in (0, 1]" if cuda_build
                else NO_BACKEND)
    assert expected in proc.stderr


# A Llama with the shapes of shared/fixtures/llama-tiny and no weights file: only
# --load-format dummy can run it.
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
    "intermediate_size": 160, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "hidden_act": "silu", "rms_norm_eps": 1e-5,
    "max_position_embeddings": 512, "rope_parameters": {"rope_theta": 10000.0,
                                                       "rope_type": "default"},
    "tie_word_embeddings": False, "vocab_size": 8192, "bos_token_id": 0, "eos_token_id": 1,
    "pad_token_id": 7, "dtype": "bfloat16",
}


def test_generate_dummy_weights(tmp_path):
    model = tmp_path / "tiny-llama"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(TINY_LLAMA))
    shutil.copy(MODEL_DIR / "tokenizer.json", model / "tokenizer.json")
    lines = [{"custom_id": "a", "prompt": [0, 940, 266, 369], "max_tokens": 6,
              "temperature": 0, "ignore_eos": True, "logprobs": 0,
              "return_tokens_as_token_ids": True},
             {"custom_id": "b", "prompt": [0, 415, 343], "max_tokens": 6, "temperature": 0,
              "ignore_eos": True, "logprobs": 0, "return_tokens_as_token_ids": True}]
    proc = generate(tmp_path, "--load-format", "dummy", model=model, lines=lines)
    assert proc.returncode == 0, proc.stderr
    assert "engine ready on cpu" in proc.stderr
    out = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [o["custom_id"] for o in out] == ["a", "b"]
    ids = [[int(t.split(":")[1]) for t in o["choices"][0]["logprobs"]["tokens"]] for o in out]
    # The dummy values are fixed (seed 0x5eed, engine/model/dummy_weights.h), so are these.
    assert ids == [[1681, 4538, 7390, 4278, 7584, 2045], [5911, 3306, 2612, 4150, 5164, 3862]]
    assert [o["choices"][0]["finish_reason"] for o in out] == ["length", "length"]
    # Without weights the plain loader fails, naming the missing file.
    proc = generate(tmp_path, model=model, lines=lines)
    assert proc.returncode == 1
    assert "cannot load the model" in proc.stderr
