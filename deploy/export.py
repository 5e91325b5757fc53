"""`make k8s` and `make compose`: `jina export` of deploy/flow.yml, completed with what the
export lacks, written under deploy/ (checked in; tests/service/test_deploy.py validates them).

    python deploy/export.py kubernetes|docker-compose

Kubernetes, in deploy/k8s/cpu and deploy/k8s/gpu (the `gpus` variant): a readiness probe; a
liveness probe whose timeout applies (the export passes `--timeout 9500` as one argument,
which `jina ping` ignores, so the probe gives up after its default 3 s); resource requests
(and an NVIDIA GPU); the metrics port, annotated for Prometheus; the executor's replicas
from the flow; the executor's Service headless, so that the gateway's router sees every pod. Docker
Compose, in deploy/docker-compose.yml: without the export's mount of
the host's ~/.cache/jina over the image's WORKDIR, which would hide config.yml.
"""
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
VERSION = "0.1.0"
IMAGES = {"cpu": ("llm-stream-executor:0.1.0-cpu", "llm-stream-gateway:0.1.0-cpu"),
          "gpu": ("llm-stream-executor:0.1.0-cuda", "llm-stream-gateway:0.1.0-cpu")}
METRICS_PORT = 9100
RESOURCES = {"cpu": {"requests": {"cpu": "2", "memory": "2Gi"}, "limits": {"memory": "4Gi"}},
             "gpu": {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"memory": "8Gi", "nvidia.com/gpu": "1"}}}
GATEWAY_RESOURCES = {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "2Gi"}}


def flow(variant: str) -> dict:
    spec = yaml.safe_load((HERE / "flow.yml").read_text())
    executor_image, gateway_image = IMAGES[variant]
    spec["gateway"]["uses"] = f"docker://{gateway_image}"
    spec["executors"][0]["uses"] = f"docker://{executor_image}"
    if variant == "gpu":
        spec["executors"][0]["gpus"] = 1
    return spec


def jina_export(kind: str, spec: dict, out: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "flow.yml"
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
        # the export copies JINA_* variables of this shell (JINA_LOG_LEVEL...) into the manifests
        env = {k: v for k, v in os.environ.items() if not k.startswith("JINA_")}
        env["JINA_GATEWAY_IMAGE"] = spec["gateway"]["uses"].removeprefix("docker://")
        args = ["--k8s-namespace", "llm-stream"] if kind == "kubernetes" else []
        subprocess.run([str(Path(sys.executable).parent / "jina"), "export", kind, str(path), str(out), *args],
                       check=True, env=env, capture_output=True)


def ping(role: str, timeout_ms: int) -> list[str]:
    return ["jina", "ping", role, "grpc://127.0.0.1:8080", "--timeout", str(timeout_ms)]


def complete_executor(container: dict, pod: dict, variant: str) -> None:
    container["livenessProbe"] = {"exec": {"command": ping("executor", 9500)}, "initialDelaySeconds": 30,
                                  "periodSeconds": 10, "timeoutSeconds": 12, "failureThreshold": 3}
    container["readinessProbe"] = {"exec": {"command": ping("executor", 5000)}, "periodSeconds": 5,
                                   "timeoutSeconds": 7, "failureThreshold": 2}
    container["resources"] = RESOURCES[variant]
    container["ports"].append({"containerPort": METRICS_PORT, "name": "metrics"})
    container.setdefault("env", []).append({"name": "LLM_METRICS_PORT", "value": str(METRICS_PORT)})
    pod["metadata"].setdefault("annotations", {}).update(
        {"prometheus.io/scrape": "true", "prometheus.io/port": str(METRICS_PORT), "prometheus.io/path": "/metrics"})


def complete_gateway(container: dict, pod: dict) -> None:
    # the executor's Service is headless: its name resolves to every ready pod, and the router
    # looks it up again and again (gateway/fleet/membership.py), so pods join and leave its rotation
    container.setdefault("env", []).append({"name": "LLM_ROUTER_RESOLVE", "value": "1"})
    container["livenessProbe"] = {"exec": {"command": ping("gateway", 9500)}, "initialDelaySeconds": 30,
                                  "periodSeconds": 10, "timeoutSeconds": 12, "failureThreshold": 3}
    # ready when the executor answers too (TGI's /health asks it), on the HTTP port
    container["readinessProbe"] = {"httpGet": {"path": "/health", "port": 8081}, "periodSeconds": 5,
                                   "timeoutSeconds": 5, "failureThreshold": 2}
    container["resources"] = GATEWAY_RESOURCES


def complete_k8s(out: Path, variant: str) -> None:
    for path in sorted(out.rglob("*.yml")):
        docs = list(yaml.safe_load_all(path.read_text()))
        for doc in docs:
            if doc.get("kind") == "Service" and doc["metadata"]["name"] == "llm":
                doc["spec"]["clusterIP"] = "None"  # headless: one address per pod, for the router
            if doc.get("kind") != "Deployment":
                continue
            pod = doc["spec"]["template"]
            container = pod["spec"]["containers"][0]
            if container["args"][0] == "executor":
                complete_executor(container, pod, variant)
            else:
                complete_gateway(container, pod)
        path.write_text(yaml.safe_dump_all(docs, sort_keys=False))


def complete_compose(path: Path) -> None:
    spec: dict[str, Any] = yaml.safe_load(path.read_text())
    for service in spec["services"].values():
        service.pop("volumes", None)  # the host's ~/.cache/jina over /app would hide config.yml
        service["command"] = [arg.replace("/app/.cache/jina", "/tmp/jina") for arg in service.get("command", [])]
    path.write_text(yaml.safe_dump(spec, sort_keys=False))


def main(kind: str) -> None:
    if kind == "kubernetes":
        for variant in ("cpu", "gpu"):
            out = HERE / "k8s" / variant
            subprocess.run(["rm", "-rf", str(out)], check=True)
            jina_export("kubernetes", flow(variant), out)
            complete_k8s(out, variant)
            print(out)
    elif kind == "docker-compose":
        out = HERE / "docker-compose.yml"
        jina_export("docker-compose", flow("cpu"), out)
        complete_compose(out)
        print(out)
    else:
        sys.exit("usage: deploy/export.py kubernetes|docker-compose")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "")
