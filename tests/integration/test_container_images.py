"""deploy/docker: the CPU and CUDA images are built by the scripts CI uses, run as a numeric
non-root user, and their entrypoint serves on the host.

No container builder is assumed here: the Dockerfiles are checked as text, and the final stage's
ENTRYPOINT + CMD run on the host with the image's /opt/sluice mapped onto this checkout's build,
as user 65532 from a directory it cannot write (the image's read-only root filesystem).
"""

import json
import os
import pathlib
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request

import pytest

from sluice_cluster import free_port, sluice_bin, wait_until

REPO = pathlib.Path(__file__).resolve().parents[2]
DOCKER = REPO / "deploy" / "docker"
IMAGE_UID = 65532


def stages(dockerfile):
    """[(FROM line, [instructions])] with continuation lines joined."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            out.append((line, []))
        elif out:
            out[-1][1].append(line)
    return out


def instruction(lines, name):
    found = [l[len(name) + 1:].strip() for l in lines if l.upper().startswith(name + " ")]
    return found[-1] if found else None


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.cuda"])
def test_dockerfile_builds_with_ci_scripts_and_runs_as_non_root(name):
    build, final = stages(DOCKER / name)
    run = " ".join(l for l in build[1] if l.upper().startswith("RUN "))
    assert "scripts/install_deps.sh" in run and "scripts/build.sh" in run
    assert "-DSLUICE_NATIVE=OFF" in run  # portable kernels
    assert ("-DSLUICE_CUDA=ON" if name.endswith("cuda") else "-DSLUICE_CUDA=OFF") in run
    assert "install_deps.sh --runtime" in " ".join(final[1])
    user = instruction(final[1], "USER")
    assert user == f"{IMAGE_UID}:{IMAGE_UID}"
    entrypoint = json.loads(instruction(final[1], "ENTRYPOINT"))
    assert entrypoint == ["/opt/sluice/bin/sluice"]
    cmd = json.loads(instruction(final[1], "CMD"))
    assert cmd[0] == "serve" and "--model" in cmd
    if name.endswith("cuda"):
        assert cmd[cmd.index("--device") + 1] == "cuda"


def test_runtime_packages_provide_every_library_sluice_loads():
    """install_deps.sh --runtime names the Debian packages of every shared library the binary
    needs (beyond libc/libstdc++, which every Debian image has)."""
    script = (REPO / "scripts" / "install_deps.sh").read_text()
    packages = set(re.search(r"RUNTIME_PACKAGES=\(([^)]*)\)", script).group(1).split())
    if shutil.which("ldd") is None or shutil.which("dpkg") is None:
        pytest.skip("needs ldd and dpkg (Debian)")
    out = subprocess.run(["ldd", sluice_bin()], capture_output=True, text=True, check=True).stdout
    base = {"libc6", "libstdc++6", "libgcc-s1", "libcublas13", "libcublaslt13"}
    needed = set()
    for line in out.splitlines():
        m = re.search(r"=> (\S+)", line)
        if not m:
            continue
        owner = subprocess.run(["dpkg", "-S", os.path.realpath(m.group(1))], capture_output=True,
                               text=True)
        if owner.returncode != 0:
            continue  # not from a Debian package (e.g. a CUDA toolkit library)
        needed.add(owner.stdout.split(":")[0])
    missing = needed - packages - base
    assert not missing, f"install_deps.sh --runtime lacks {sorted(missing)}"


def test_image_entrypoint_serves_on_the_host_as_the_image_user():
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv (util-linux) to run as the image's user")
    final = stages(DOCKER / "Dockerfile")[-1][1]
    command = json.loads(instruction(final, "ENTRYPOINT")) + json.loads(instruction(final, "CMD"))
    # The image's layout under one folder: /opt/sluice/bin/sluice and /models, world-readable.
    opt = pathlib.Path(tempfile.mkdtemp(prefix="sluice-image-"))
    (opt / "bin").mkdir()
    shutil.copy(sluice_bin(), opt / "bin" / "sluice")
    shutil.copytree(REPO / "models", opt / "models")
    for path in [opt, *opt.rglob("*")]:
        path.chmod(0o755 if path.is_dir() or path.name == "sluice" else 0o644)
    command = [c.replace("/opt/sluice", str(opt)).replace("/models", str(opt / "models"), 1)
               if c.startswith("/models") else c.replace("/opt/sluice", str(opt))
               for c in command]
    port = free_port()
    command[command.index("--port") + 1] = str(port)
    command[command.index("--host") + 1] = "127.0.0.1"
    proc = subprocess.Popen(["setpriv", f"--reuid={IMAGE_UID}", f"--regid={IMAGE_UID}",
                             "--clear-groups", *command], cwd=str(opt),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"})
    try:
        url = f"http://127.0.0.1:{port}"
        def healthy():
            if proc.poll() is not None:
                raise RuntimeError(proc.stdout.read().decode(errors="replace"))
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                return r.status == 200
        wait_until(healthy, 120, "the image's entrypoint to serve")
        body = json.dumps({"model": "sluice-mini-moe", "prompt": "Hello", "max_tokens": 4,
                           "temperature": 0}).encode()
        req = urllib.request.Request(url + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            out = json.loads(r.read())
        assert out["usage"]["completion_tokens"] == 4
        # Nothing was written next to the binary or the model (the image's root is read-only).
        assert sorted(p.name for p in opt.iterdir()) == ["bin", "models"]
    finally:
        proc.terminate()
        proc.wait(timeout=15)
        shutil.rmtree(opt, ignore_errors=True)
