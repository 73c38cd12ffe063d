"""deploy/k8s: the kustomize base, the GPU overlay and the multi-GPU decode overlay render and are consistent.

Rendered with `kubectl kustomize` when kubectl is installed (Debian: kubernetes-client);
otherwise the base files are read directly with PyYAML and the overlay's patch is checked on
its own, so the structural checks run either way.
"""

import pathlib
import shutil
import subprocess

import pytest
import yaml

REPO = pathlib.Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"
KUBECTL = shutil.which("kubectl")


def render(path: pathlib.Path):
    if KUBECTL:
        out = subprocess.run([KUBECTL, "kustomize", str(path)], check=True, capture_output=True,
                             text=True, timeout=60).stdout
        return [d for d in yaml.safe_load_all(out) if d]
    docs = []
    kustomization = yaml.safe_load((path / "kustomization.yaml").read_text())
    for name in kustomization.get("resources", []):
        if (path / name).is_dir():  # another kustomization (its patches are not applied here)
            docs += render(path / name)
        else:
            docs += [d for d in yaml.safe_load_all((path / name).read_text()) if d]
    for name in kustomization.get("components", []):
        docs += render(path / name)
    return docs


def by_kind(docs, kind):
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def container(deployment):
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def test_base_has_the_three_services():
    docs = render(K8S / "base")
    deployments = by_kind(docs, "Deployment")
    services = by_kind(docs, "Service")
    assert set(deployments) == {"sluice-router", "sluice-prefill", "sluice-decode"}
    assert set(services) == {"sluice-router", "sluice-prefill", "sluice-decode", "sluice-kvstore"}
    # The kvstore is a StatefulSet (its SSD volume); tests/integration/test_kvstore.py checks it.
    assert {d["kind"] for d in docs} == {"Deployment", "Service", "StatefulSet"}
    for name, deployment in deployments.items():
        assert deployment["apiVersion"] == "apps/v1"
        c = container(deployment)
        assert c["args"][0] == name.removeprefix("sluice-")
        assert "--model" in c["args"]
        # Probes over HTTP on a declared port; readiness on /health everywhere.
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert c["readinessProbe"]["httpGet"]["path"] == "/health"
        for probe in ("readinessProbe", "livenessProbe"):
            assert c[probe]["httpGet"]["port"] in ports, (name, probe)
        assert c["resources"]["requests"]["cpu"]
        assert c["resources"]["requests"]["memory"]
        # The selector matches the pod template's labels.
        selector = deployment["spec"]["selector"]["matchLabels"]
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= labels.items(), name
    assert container(deployments["sluice-router"])["ports"][0]["containerPort"] == 8000
    assert container(deployments["sluice-prefill"])["livenessProbe"]["httpGet"]["path"] == "/health"
    assert container(deployments["sluice-decode"])["livenessProbe"]["httpGet"]["path"] == "/health"
    # Workers register with the router's Service on its gRPC port.
    router_ports = {p["name"]: p["port"] for p in services["sluice-router"]["spec"]["ports"]}
    assert router_ports == {"http": 8000, "grpc": 7000}
    for worker in ("sluice-prefill", "sluice-decode"):
        args = container(deployments[worker])["args"]
        assert args[args.index("--router") + 1] == f"sluice-router:{router_ports['grpc']}"


def test_deployments_drain_within_their_grace_period():
    """SIGTERM drains router and workers (--drain-timeout-s); the pod's grace period covers the
    preStop sleep plus the drain, so Kubernetes never SIGKILLs a drain in progress."""
    deployments = by_kind(render(K8S / "base"), "Deployment")
    for name, deployment in deployments.items():
        spec = deployment["spec"]["template"]["spec"]
        c = container(deployment)
        args = c["args"]
        assert "--drain-timeout-s" in args, name
        drain = float(args[args.index("--drain-timeout-s") + 1])
        command = c["lifecycle"]["preStop"]["exec"]["command"]
        assert command[0] == "sleep", (name, command)
        pre_stop = float(command[1])
        assert spec["terminationGracePeriodSeconds"] >= pre_stop + drain + 5, name


def test_every_service_selects_a_deployment_and_named_ports():
    docs = render(K8S / "base")
    deployments = {**by_kind(docs, "Deployment"), **by_kind(docs, "StatefulSet")}
    for name, service in by_kind(docs, "Service").items():
        selector = service["spec"]["selector"]
        matches = [d for d in deployments.values()
                   if selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()]
        assert len(matches) == 1, f"Service {name} selects {len(matches)} Deployments"
        port_names = {p["name"] for p in container(matches[0])["ports"]}
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in port_names, (name, port)


def test_gpu_overlay_requests_gpus_for_workers_only():
    if KUBECTL:
        docs = render(K8S / "overlays" / "gpu")
    else:
        overlay = K8S / "overlays" / "gpu"
        kustomization = yaml.safe_load((overlay / "kustomization.yaml").read_text())
        docs = []
        for patch in kustomization["patches"]:
            if "path" in patch:
                docs += [d for d in yaml.safe_load_all((overlay / patch["path"]).read_text()) if d]
        appended = {p["target"]["name"]: [op["value"] for op in yaml.safe_load(p["patch"])]
                    for p in kustomization["patches"] if "patch" in p}
    deployments = by_kind(docs, "Deployment")
    for worker in ("sluice-prefill", "sluice-decode"):
        resources = container(deployments[worker])["resources"]
        assert resources["limits"]["nvidia.com/gpu"] == 1
        assert resources["requests"]["nvidia.com/gpu"] == 1
        # The GPU workers run the CUDA engine (KV in device memory, moved over UCX).
        args = container(deployments[worker])["args"] if KUBECTL else appended[worker]
        assert flag_value(args, "--device") == "cuda", worker
    if KUBECTL:
        router = container(deployments["sluice-router"])
        assert "--device" not in router["args"]
        assert "nvidia.com/gpu" not in router["resources"].get("limits", {})
        assert router["readinessProbe"]["httpGet"]["path"] == "/health"
        assert container(deployments["sluice-decode"])["image"].endswith(":latest-cuda")


def flag_value(args, flag):
    assert args.count(flag) == 1, (flag, args)
    return args[args.index(flag) + 1]


def test_gpu_tp2_overlay_decode_pool_holds_two_ranks_per_pod():
    overlay = K8S / "overlays" / "gpu-tp2"
    if KUBECTL:
        deployments = by_kind(render(overlay), "Deployment")
        decode = container(deployments["sluice-decode"])
        prefill = container(deployments["sluice-prefill"])
        args = decode["args"]
        # The base's arguments are kept (the flags are appended, not a replaced list).
        assert args[:2] == ["decode", "--model"] and "--router" in args
        assert decode["image"].endswith(":latest-cuda")
        # Prefill keeps the GPU overlay's single GPU, CUDA engine and no parallel flags.
        assert prefill["resources"]["limits"]["nvidia.com/gpu"] == 1
        assert "--tensor-parallel-size" not in prefill["args"]
        assert flag_value(prefill["args"], "--device") == "cuda"
        # --device cuda refuses TP/EP > 1: the two-rank decode pool runs the CPU ranks.
        assert flag_value(args, "--device") == "cpu"
        resources = decode["resources"]
    else:  # the overlay's own files: the GPU patch and the appended flags
        kustomization = yaml.safe_load((overlay / "kustomization.yaml").read_text())
        patch = yaml.safe_load((overlay / "decode-gpus.yaml").read_text())
        resources = container(patch)["resources"]
        ops = [op for p in kustomization["patches"] if "patch" in p
               for op in yaml.safe_load(p["patch"])]
        assert {"op": "replace", "path": "/spec/template/spec/containers/0/args/18",
                "value": "cpu"} in ops
        args = [op["value"] for op in ops if op["op"] == "add"]
    # One process per pod holding N ranks: N GPUs requested = the parallel sizes.
    gpus = resources["limits"]["nvidia.com/gpu"]
    assert gpus == resources["requests"]["nvidia.com/gpu"] == 2
    assert flag_value(args, "--tensor-parallel-size") == str(gpus)
    assert flag_value(args, "--expert-parallel-size") == str(gpus)


@pytest.mark.skipif(KUBECTL is None, reason="kubectl not installed")
def test_kubectl_renders_without_errors():
    for path in (K8S / "base", K8S / "overlays" / "gpu", K8S / "overlays" / "gpu-tp2",
                 K8S / "overlays" / "keda", K8S / "overlays" / "vision",
                 K8S / "overlays" / "vision-keda", K8S / "overlays" / "tls"):
        result = subprocess.run([KUBECTL, "kustomize", str(path)], capture_output=True,
                                text=True, timeout=60)
        assert result.returncode == 0, result.stderr


@pytest.mark.skipif(KUBECTL is None, reason="kubectl not installed (the overlay is patches only)")
def test_tls_overlay_mounts_each_services_certificate():
    """overlays/tls: every service mounts its own Secret (tls.crt, tls.key, ca.crt) read-only and
    passes the files as --tls-cert/--tls-key/--tls-ca (mTLS between services, HTTPS on the
    router); the key is readable by the image's user only through fsGroup; the router's probes
    switch to HTTPS while the workers' plain-HTTP /health probes stay."""
    docs = render(K8S / "overlays" / "tls")
    workloads = {**by_kind(docs, "Deployment"), **by_kind(docs, "StatefulSet")}
    assert set(workloads) == {"sluice-router", "sluice-prefill", "sluice-decode", "sluice-kvstore"}
    for name, workload in workloads.items():
        pod = workload["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["tls"]["secret"]["secretName"] == f"{name}-tls"
        assert volumes["tls"]["secret"]["defaultMode"] == 0o440
        assert pod["securityContext"]["fsGroup"] == 65532
        c = container(workload)
        mounts = {m["name"]: m for m in c["volumeMounts"]}
        assert mounts["tls"]["mountPath"] == "/etc/sluice/tls" and mounts["tls"]["readOnly"]
        args = c["args"]
        assert flag_value(args, "--tls-cert") == "/etc/sluice/tls/tls.crt", name
        assert flag_value(args, "--tls-key") == "/etc/sluice/tls/tls.key", name
        assert flag_value(args, "--tls-ca") == "/etc/sluice/tls/ca.crt", name
        assert args.count("--tls-ca") == 1
        schemes = {c[p]["httpGet"].get("scheme", "HTTP") for p in ("readinessProbe",
                                                                    "livenessProbe")}
        assert schemes == ({"HTTPS"} if name == "sluice-router" else {"HTTP"}), name
    # Everything else is the base's.
    base = {**by_kind(render(K8S / "base"), "Deployment"),
            **by_kind(render(K8S / "base"), "StatefulSet")}
    for name, workload in workloads.items():
        args = container(workload)["args"]
        assert args[:len(container(base[name])["args"])] == container(base[name])["args"]


@pytest.mark.parametrize("overlay,pools", [("keda", {"prefill", "decode"}),
                                           ("vision-keda", {"prefill", "decode", "encoder"})])
def test_keda_overlay_scales_each_pool_to_the_planners_number(overlay, pools):
    """overlays/keda: one ScaledObject per worker pool, reading the router's
    sluice_planner_desired_replicas{pool} with threshold 1 (AverageValue: replicas = the value);
    overlays/vision-keda: the same plus the encoder pool's."""
    if overlay == "vision-keda" and not KUBECTL:
        pytest.skip("kubectl not installed: the vision overlay's patches need kustomize")
    docs = render(K8S / "overlays" / overlay)
    scaled = by_kind(docs, "ScaledObject")
    deployments = by_kind(docs, "Deployment")
    assert set(scaled) == {f"sluice-{pool}" for pool in pools}
    assert set(deployments) == {"sluice-router"} | set(scaled)
    for name, obj in scaled.items():
        assert obj["apiVersion"] == "keda.sh/v1alpha1"
        assert obj["spec"]["scaleTargetRef"]["name"] in deployments
        assert obj["spec"]["scaleTargetRef"]["name"] == name
        assert 1 <= obj["spec"]["minReplicaCount"] <= obj["spec"]["maxReplicaCount"]
        (trigger,) = obj["spec"]["triggers"]
        assert trigger["type"] == "prometheus"
        pool = name.removeprefix("sluice-")
        assert trigger["metadata"]["query"] == \
            f'max(sluice_planner_desired_replicas{{pool="{pool}"}})'
        assert trigger["metadata"]["threshold"] == "1"
        assert trigger["metadata"].get("metricType", "AverageValue") == "AverageValue"


def test_workloads_run_the_image_non_root_on_a_read_only_root():
    """The base names the image deploy/docker builds and runs it as it is built to run: user
    65532, read-only root filesystem, a writable /tmp (emptyDir); --model under /models."""
    docs = render(K8S / "base")
    for name, deployment in by_kind(docs, "Deployment").items():
        c = container(deployment)
        if KUBECTL:  # the kustomization's images: entry applied
            assert c["image"] == "ghcr.io/sluice/sluice:latest", (name, c["image"])
        sc = c["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 65532, name
        assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
        assert "emptyDir" in volumes[mounts["/tmp"]], name
        assert c["args"][c["args"].index("--model") + 1].startswith("/models/")
    # The kvstore shards too: their SSD volume is group-owned by the image's group.
    kvstore = by_kind(docs, "StatefulSet")["sluice-kvstore"]
    sc = container(kvstore)["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 65532
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert kvstore["spec"]["template"]["spec"]["securityContext"]["fsGroup"] == 65532
    mounts = {m["mountPath"]: m["name"] for m in container(kvstore)["volumeMounts"]}
    args = container(kvstore)["args"]
    assert args[args.index("--ssd-dir") + 1].startswith("/data/") and mounts["/data"] == "data"
    assert "emptyDir" in {v["name"]: v for v in kvstore["spec"]["template"]["spec"]["volumes"]}[
        mounts["/tmp"]]
    dockerfile = (REPO / "deploy" / "docker" / "Dockerfile").read_text()
    assert "USER 65532:65532" in dockerfile and "/models" in dockerfile


def test_vision_overlay_adds_the_encoder_pool():
    """overlays/vision: the encoder Deployment + headless Service beside the base pools, every
    pool on the same LLaVA folder (the image content hashes must agree), the encoder registering
    with the router's gRPC port, probed on /health, draining within its grace period."""
    if not KUBECTL:
        pytest.skip("kubectl not installed: the overlay's patches need kustomize")
    docs = render(K8S / "overlays" / "vision")
    deployments = by_kind(docs, "Deployment")
    services = by_kind(docs, "Service")
    assert set(deployments) == {"sluice-router", "sluice-prefill", "sluice-decode",
                                "sluice-encoder"}
    assert "sluice-encoder" in services
    models = {name: container(d)["args"][container(d)["args"].index("--model") + 1]
              for name, d in deployments.items()}
    assert set(models.values()) == {"/models/llava"}, models
    encoder = deployments["sluice-encoder"]
    c = container(encoder)
    assert c["args"][0] == "encoder"
    assert c["args"][c["args"].index("--router") + 1] == "sluice-router:7000"
    assert c["args"][c["args"].index("--listen") + 1] == "$(POD_IP):7300"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"grpc": 7300, "http": 9000}
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"] == {"path": "/health", "port": "http"}
    assert c["securityContext"]["runAsUser"] == 65532
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    drain = float(c["args"][c["args"].index("--drain-timeout-s") + 1])
    grace = encoder["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    sleep = int(c["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert sleep + drain < grace
    selector = services["sluice-encoder"]["spec"]["selector"]
    assert selector.items() <= encoder["spec"]["template"]["metadata"]["labels"].items()
    assert {p["targetPort"] for p in services["sluice-encoder"]["spec"]["ports"]} <= set(ports)
