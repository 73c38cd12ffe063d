"""`sluice --version` and `sluice version` print the version and the git commit of the build;
so does `--version` after any subcommand (`sluice serve --version`), which needs none of the
subcommand's required options. With an argument no command knows (`sluice --version --foo`) it is
the usual usage error (exit 2, test_cli_usage.py), not a version.

The commit is `git describe --always --dirty` of the checkout at build time (cmake/
build_info.cmake runs at every build); a build from sources outside git (a tarball) says
"unknown", checked here by running the script on a copy of the sources without .git.
"""

import pathlib
import re
import shutil
import subprocess

import pytest

from conftest import REPO, sluice_bin

LINE_RE = re.compile(r"^sluice (\d+\.\d+\.\d+) \(git (\S+)\)$")


def project_version():
    text = (REPO / "CMakeLists.txt").read_text()
    return re.search(r"project\(sluice VERSION (\d+\.\d+\.\d+)", text).group(1)


@pytest.mark.parametrize("args", [["--version"], ["version"]])
def test_version_prints_version_and_commit(args):
    r = subprocess.run([sluice_bin(), *args], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 1, r.stdout
    m = LINE_RE.match(lines[0])
    assert m, lines[0]
    assert m.group(1) == project_version()
    commit = m.group(2)
    if commit == "unknown":
        # Only a build outside git says so; this test runs in the checkout it was built from.
        assert not (REPO / ".git").exists(), "a build from a git checkout must name its commit"
        return
    # A commit of this repository (the build may be older than HEAD).
    sha = re.fullmatch(r"(?:.*-g)?([0-9a-f]{7,40})(-dirty)?", commit)
    assert sha, commit
    exists = subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", sha.group(1) + "^{commit}"],
                            capture_output=True)
    assert exists.returncode == 0, f"{commit} is not a commit of {REPO}"


def run(*args):
    return subprocess.run([sluice_bin(), *args], capture_output=True, text=True, timeout=30)


def test_version_needs_no_subcommand_arguments():
    # `sluice` alone still asks for a subcommand (usage error), and --version wins over one.
    r = run()
    assert r.returncode == 2, (r.stdout, r.stderr)
    r = run("--version", "serve")
    assert r.returncode == 0 and LINE_RE.match(r.stdout.strip()), (r.stdout, r.stderr)


@pytest.mark.parametrize("args", [["serve", "--version"], ["prefill", "--version"],
                                  ["router", "--version"], ["eval", "ppl", "--version"],
                                  ["--version", "decode"], ["--version=true"]])
def test_version_after_any_subcommand(args):
    # As the top-level flag: no "--model is required" (nothing is needed to print the version).
    r = run(*args)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert LINE_RE.match(r.stdout.strip()) and len(r.stdout.splitlines()) == 1, r.stdout
    assert r.stderr == ""


@pytest.mark.parametrize("args, unknown, command", [(["--version", "--foo"], "--foo", "sluice"),
                                                    (["serve", "--version", "--bogus"], "--bogus",
                                                     "sluice serve"),
                                                    (["--version", "serve", "--bogus"], "--bogus",
                                                     "sluice serve"),
                                                    (["version", "--foo"], "--foo",
                                                     "sluice version")])
def test_version_with_an_unknown_argument_is_a_usage_error(args, unknown, command):
    # The same error and exit code (2) as the unknown flag gets without --version.
    expected = (f"sluice: error: unrecognized argument: {unknown}\n"
                f"Run '{command} --help' for usage.\n")
    if command == "sluice serve":
        reference = run("serve", "--model", "m", unknown)
        assert (reference.returncode, reference.stderr) == (2, expected)
    r = run(*args)
    assert (r.returncode, r.stdout, r.stderr) == (2, "", expected)


def test_version_with_a_bad_value_is_a_usage_error():
    reference = run("serve", "--model", "m", "--max-num-seqs", "-1")
    r = run("serve", "--version", "--max-num-seqs", "-1")
    assert reference.returncode == 2, reference.stderr
    assert reference.stderr == ("sluice: error: --max-num-seqs: invalid value '-1' (expected an "
                                "integer > 0)\nRun 'sluice serve --help' for usage.\n")
    assert (r.returncode, r.stdout, r.stderr) == (reference.returncode, "", reference.stderr)


def run_build_info(source_dir, out):
    cmake = shutil.which("cmake")
    if cmake is None:
        pytest.skip("cmake not on PATH")
    subprocess.run([cmake, f"-DSOURCE_DIR={source_dir}", f"-DOUTPUT={out}", "-DVERSION=9.8.7",
                    "-P", str(REPO / "cmake" / "build_info.cmake")], check=True, timeout=60)
    return out.read_text()


def test_build_outside_git_says_unknown(tmp_path):
    # A source tarball: the script sees no git checkout at SOURCE_DIR.
    source = tmp_path / "sluice-src"
    source.mkdir()
    (source / "CMakeLists.txt").write_text("project(sluice VERSION 9.8.7)\n")
    text = run_build_info(source, tmp_path / "info.cc")
    assert 'SluiceVersion() { return "9.8.7"; }' in text, text
    assert 'SluiceGitCommit() { return "unknown"; }' in text, text


def test_build_inside_another_repository_says_unknown(tmp_path):
    # Unpacked inside some other git checkout: that repository's commit is not this build's.
    if shutil.which("git") is None:
        pytest.skip("git not on PATH")
    outer = tmp_path / "outer"
    subprocess.run(["git", "init", "-q", str(outer)], check=True)
    subprocess.run(["git", "-C", str(outer), "-c", "user.name=t", "-c", "user.email=t@t",
                    "commit", "-q", "--allow-empty", "-m", "outer"], check=True)
    source = outer / "sluice-src"
    source.mkdir()
    text = run_build_info(source, tmp_path / "info.cc")
    assert 'SluiceGitCommit() { return "unknown"; }' in text, text


def test_build_in_the_checkout_names_head(tmp_path):
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    text = run_build_info(REPO, tmp_path / "info.cc")
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short=12", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()
    m = re.search(r'SluiceGitCommit\(\) \{ return "([^"]+)"; \}', text)
    assert m and head in m.group(1), (head, text)
    # Rewritten only when its text changes (no rebuild of the binary otherwise).
    out = tmp_path / "info.cc"
    before = out.stat().st_mtime_ns
    run_build_info(REPO, out)
    assert out.stat().st_mtime_ns == before
