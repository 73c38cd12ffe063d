"""Usage errors of the `sluice` command line: every argument it refuses exits 2 (argparse's and
most Unix tools' code, not CLI11's 104-114) with "sluice: error: ..." naming the bad argument and
the form it expects, and a hint to the subcommand's --help. --help still exits 0.

No case starts a server: each fails while the command line is parsed."""

import subprocess

import pytest

from conftest import sluice_bin

SUBCOMMANDS = "version, serve, generate, router, prefill, decode, kvstore, eval, encoder"


def run(*args):
    return subprocess.run([sluice_bin(), *args], capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("args, error, command", [
    ([], f"missing subcommand (expected one of: {SUBCOMMANDS})", "sluice"),
    (["bogus"], f"unknown subcommand 'bogus' (expected one of: {SUBCOMMANDS})", "sluice"),
    (["serv"], f"unknown subcommand 'serv' (expected one of: {SUBCOMMANDS}); did you mean serve?",
     "sluice"),
    (["eval"], "missing subcommand for 'sluice eval' (expected one of: ppl)", "sluice eval"),
    (["eval", "pll"], "unknown subcommand 'pll' for 'sluice eval' (expected one of: ppl); did you "
     "mean ppl?", "sluice eval"),
    (["serve", "--model", "m", "--port", "abc"],
     "--port: invalid value 'abc' (expected an integer in [0, 65535])", "sluice serve"),
    (["serve", "--port", "70000"],
     "--port: invalid value '70000' (expected an integer in [0, 65535])", "sluice serve"),
    (["serve", "--model", "m", "--max-num-seqs", "0"],
     "--max-num-seqs: invalid value '0' (expected an integer > 0)", "sluice serve"),
    (["serve", "--model", "m", "--gpu-memory-utilization", "lots"],
     "--gpu-memory-utilization: invalid value 'lots' (expected a number in [0, 1])", "sluice serve"),
    (["serve", "--model", "m", "--device", "tpu"],
     "--device: invalid value 'tpu' (expected one of: cpu, cuda)", "sluice serve"),
    (["router", "--model", "m", "--grpc-port", "-1"],
     "--grpc-port: invalid value '-1' (expected an integer in [0, 65535])", "sluice router"),
    # An unknown option is named before the required --model it hides.
    (["serve", "--bogus"], "unrecognized argument: --bogus", "sluice serve"),
    (["serve", "--model", "m", "--prot", "8000"],
     "unrecognized arguments: --prot 8000; did you mean --port?", "sluice serve"),
    (["serve", "--model", "m", "extra"], "unrecognized argument: extra", "sluice serve"),
    (["serve"], "--model is required", "sluice serve"),
    (["serve", "--model"], "--model: missing value", "sluice serve"),
    (["serve", "--port", "--model", "m"],
     "--port: invalid value '--model' (expected an integer in [0, 65535])", "sluice serve"),
    (["eval", "ppl"], "file is required", "sluice eval ppl"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_usage_errors_exit_2_naming_the_argument(args, error, command):
    r = run(*args)
    assert (r.returncode, r.stdout, r.stderr) == (
        2, "", f"sluice: error: {error}\nRun '{command} --help' for usage.\n")


@pytest.mark.parametrize("args", [["--help"], ["serve", "--help"], ["eval", "ppl", "--help"]])
def test_help_exits_0(args):
    r = run(*args)
    assert (r.returncode, r.stderr) == (0, "")
    assert "Usage:" in r.stdout and "--help" in r.stdout, r.stdout
