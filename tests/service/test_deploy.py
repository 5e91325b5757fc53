"""The checked-in cluster manifests (deploy/, from `make k8s` and `make compose`): images,
ports, probes that work, env, replicas, resources, the GPU variant, the router's view of the pods;
they are valid for a current Kubernetes (kubernetes-validate, offline), and they are what the
export writes today."""
import filecmp
import shutil
import subprocess
import sys

import kubernetes_validate
import pytest
import yaml

from tests.conftest import ROOT

DEPLOY = ROOT / "deploy"


KUBERNETES = "1.33.0"  # a current release, whose schemas kubernetes-validate ships
INFERENCE_POOL = {"selector": dict, "targetPorts": list, "endpointPickerRef": dict}  # GIE v1's required fields


def manifests() -> list[tuple[str, dict]]:
    return [(str(path.relative_to(DEPLOY)), doc) for path in sorted((DEPLOY / "k8s").rglob("*.yml"))
            for doc in yaml.safe_load_all(path.read_text()) if doc]


@pytest.mark.parametrize("name,doc", manifests(), ids=lambda x: x if isinstance(x, str) else x["kind"])
def test_every_manifest_is_valid_kubernetes(name, doc):
    if doc["kind"] == "InferencePool":  # a CRD: the Gateway API Inference Extension's v1 fields
        assert doc["apiVersion"] == "inference.networking.k8s.io/v1"
        spec = doc["spec"]
        assert {k: type(spec.get(k)) for k in INFERENCE_POOL} == INFERENCE_POOL, spec
        assert spec["selector"]["matchLabels"] and all(isinstance(p["number"], int) for p in spec["targetPorts"])
        assert spec["endpointPickerRef"]["name"] and isinstance(spec["endpointPickerRef"]["port"]["number"], int)
        return
    kubernetes_validate.validate(doc, KUBERNETES, strict=True)


def test_the_inference_pool_picks_pods_that_each_answer_whole():
    """GIE's endpoint picker routes to a pod: each pod holds a gateway and its executor, the pool's
    port is the gateway's HTTP port, and the pod serves the metrics the picker reads."""
    docs = {doc["kind"]: doc for _, doc in manifests() if "inference-pool" in _}
    pod = docs["Deployment"]["spec"]["template"]
    assert pod["metadata"]["labels"] == docs["InferencePool"]["spec"]["selector"]["matchLabels"]
    containers = {c["name"]: c for c in pod["spec"]["containers"]}
    assert {p["containerPort"] for p in containers["gateway"]["ports"]} == {
        p["number"] for p in docs["InferencePool"]["spec"]["targetPorts"]}
    assert {"name": "LLM_METRICS_PORT", "value": "9100"} in containers["executor"]["env"]
    assert "grpc://127.0.0.1:8080" in " ".join(containers["gateway"]["args"])


def deployments(variant: str) -> dict[str, dict]:
    found = {}
    for path in (DEPLOY / "k8s" / variant).rglob("*.yml"):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc["kind"] in ("Deployment", "ConfigMap"):
                found[f"{doc['kind']}/{doc['metadata']['name']}"] = doc
    return found


@pytest.mark.parametrize("variant", ["cpu", "gpu"])
def test_kubernetes_manifests(variant):
    docs = deployments(variant)
    executor = docs["Deployment/llm"]["spec"]
    gateway = docs["Deployment/gateway"]["spec"]
    assert executor["replicas"] == 2
    (container,) = executor["template"]["spec"]["containers"]
    assert container["image"] == ("llm-stream-executor:0.1.0-cuda" if variant == "gpu" else "llm-stream-executor:0.1.0-cpu")
    assert {p["containerPort"] for p in container["ports"]} == {8080, 9100}
    liveness = container["livenessProbe"]["exec"]["command"]
    assert liveness[-2:] == ["--timeout", "9500"] and container["livenessProbe"]["timeoutSeconds"] > 9.5
    assert container["readinessProbe"]["exec"]["command"][:3] == ["jina", "ping", "executor"]
    assert container["resources"]["requests"]["cpu"] and container["resources"]["limits"]["memory"]
    assert ("nvidia.com/gpu" in container["resources"]["limits"]) == (variant == "gpu")
    assert {"name": "LLM_METRICS_PORT", "value": "9100"} in container["env"]
    assert executor["template"]["metadata"]["annotations"]["prometheus.io/port"] == "9100"
    assert docs["ConfigMap/llm-configmap"]["data"]["LLM_MODEL"] == "/models/SmolLM2-135M-Instruct"
    (gw,) = gateway["template"]["spec"]["containers"]
    assert gw["image"] == "llm-stream-gateway:0.1.0-cpu" and gw["args"][0] == "gateway"
    assert gw["readinessProbe"]["httpGet"] == {"path": "/health", "port": 8081}
    assert gw["livenessProbe"]["exec"]["command"][-2:] == ["--timeout", "9500"]
    assert '"llm": ["grpc://llm.llm-stream.svc:8080"]' in " ".join(gw["args"])
    assert {"name": "LLM_ROUTER_RESOLVE", "value": "1"} in gw["env"]  # the router sees every pod...
    services = {doc["metadata"]["name"]: doc for _, doc in manifests() if f"/{variant}/" in f"/{_}"
                and doc["kind"] == "Service"}
    assert services["llm"]["spec"]["clusterIP"] == "None"  # ...through the headless Service


def test_compose_manifest():
    spec = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    services = spec["services"]
    executors = [s for name, s in services.items() if name.startswith("llm-rep-")]
    assert len(executors) == 2 and all(s["image"] == "llm-stream-executor:0.1.0-cpu" for s in executors)
    assert services["gateway"]["image"] == "llm-stream-gateway:0.1.0-cpu"
    assert all("volumes" not in s for s in services.values())  # nothing hides the image's config.yml
    assert all("LLM_MODEL=/models/SmolLM2-135M-Instruct" in s["environment"] for s in executors)


def test_the_manifests_are_what_the_export_writes(tmp_path):
    copy = tmp_path / "deploy"
    shutil.copytree(DEPLOY, copy, ignore=shutil.ignore_patterns("wheels"))
    for kind in ("kubernetes", "docker-compose"):
        subprocess.run([sys.executable, str(copy / "export.py"), kind], check=True, capture_output=True)
    for variant in ("cpu", "gpu"):
        compared = filecmp.dircmp(DEPLOY / "k8s" / variant, copy / "k8s" / variant)
        assert not compared.diff_files and not compared.left_only and not compared.right_only
        for sub in compared.subdirs.values():
            assert not sub.diff_files, sub.diff_files
    assert (DEPLOY / "docker-compose.yml").read_text() == (copy / "docker-compose.yml").read_text()


def test_the_makefiles_python_modules_start_without_warnings():
    """Every engine module the Makefile runs with `python -m` starts (--help) with warnings as
    errors: runpy warns when the module it runs was imported by its package first (the model's
    export did, on every first `make serve`)."""
    import re
    modules = sorted(set(re.findall(r"\$\(PY\) -m (engine\.[\w.]+)", (ROOT / "Makefile").read_text())))
    assert "engine.model.gguf_export" in modules
    runs = {module: subprocess.Popen([sys.executable, "-W", "error::RuntimeWarning", "-m", module, "--help"],
                                     cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for module in modules}  # side by side: each spends its seconds importing torch
    for module, run in runs.items():
        _, err = run.communicate(timeout=120)
        assert run.returncode == 0 and "RuntimeWarning" not in err, (module, err[-2000:])
