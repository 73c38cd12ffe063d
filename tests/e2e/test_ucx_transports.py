"""`--ucx-transports` of the disaggregated workers: a list UCX can build no endpoint from under
peer failure detection (shared-memory or CUDA transports alone) is refused at startup with the
fix named, instead of failing every KV transfer into a prompt recompute."""

import subprocess

import pytest

from conftest import REPO, sluice_bin

LLAMA_TINY = REPO.parent / "shared" / "fixtures" / "llama-tiny"


@pytest.mark.parametrize("command", ["prefill", "decode"])
@pytest.mark.parametrize("transports", ["sm", "sm,cuda_ipc,cuda_copy"])
def test_transports_without_peer_failure_handling_are_refused(command, transports):
    proc = subprocess.run([sluice_bin(), command, "--model", str(LLAMA_TINY), "--listen",
                           "127.0.0.1:0", "--ucx-transports", transports],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert (f"INVALID_ARGUMENT: UCX transports '{transports}' have none that reports a failed "
            "peer (shared-memory and CUDA transports do not)") in proc.stderr
    assert f"add tcp (for example '{transports},tcp'" in proc.stderr
