"""The Flow that `make serve` runs: flows/llm.yml with the variables that change its shape applied.

Jina reads a Flow file's `${{ ENV.X }}` with no default, so flows/llm.yml holds literal defaults (ports
12345 and 12346, one replica), and `jina flow --uses flows/llm.yml` runs as typed with no variable
set; LLM_GRPC_PORT, LLM_HTTP_PORT and LLM_REPLICAS override them in the copy written here.

Several models: `LLM_MODELS=a,b make serve`.

The generating deployment (`llm` in flows/llm.yml) is written once per model, each with its
model under `with:`: `llm` serves the first (the one a request that names none gets), `llm_2`,
`llm_3`... the others. Each is a Deployment of its own, with its own replicas (LLM_REPLICAS each),
and the gateway routes every request on its `model` (gateway/fleet/models.py). A Flow written by
hand may do the same: any executor beside the embedder is a model of its own.
"""
import copy
import os
from pathlib import Path
from typing import Any, Optional

import yaml

from contract import settings

GENERATING = "llm"
PORTS = ("LLM_GRPC_PORT", "LLM_HTTP_PORT")  # the gateway's ports, in the order of its protocols
REPLICAS = "LLM_REPLICAS"  # each generating deployment's


def models_from_env(environ: Optional[dict] = None) -> list[str]:
    """LLM_MODELS' sources, comma-separated (folders, GGUF files, hub ids); [] when unset."""
    environ = environ if environ is not None else dict(os.environ)
    models = [source.strip() for source in environ.get("LLM_MODELS", "").split(",") if source.strip()]
    if len(models) > 1 and environ.get("LLM_MODEL_NAME"):
        raise ValueError("LLM_MODEL_NAME names one model; with LLM_MODELS each is served under its own name "
                         "(a folder's or a .gguf file's name, or the hub id)")
    return models


def with_models(flow: dict[str, Any], models: list[str]) -> dict[str, Any]:
    """`flow` with its generating deployment once per model, in the given order."""
    if len(set(models)) != len(models):
        raise ValueError(f"LLM_MODELS names a model twice: {', '.join(models)}")
    executors = flow["executors"]
    at = next(i for i, e in enumerate(executors) if e["name"] == GENERATING)
    copies = []
    for number, source in enumerate(models, start=1):
        executor = copy.deepcopy(executors[at])
        executor["name"] = GENERATING if number == 1 else f"{GENERATING}_{number}"
        if number > 1:  # beside the first in Jina's graph, not after it: its answers are not its input
            executor["needs"] = "gateway"
        executor.setdefault("uses_with", {})["model"] = source
        copies.append(executor)
    return {**flow, "executors": executors[:at] + copies + executors[at + 1:]}


def with_environment(flow: dict[str, Any], environ: dict) -> dict[str, Any]:
    """`flow` with LLM_GRPC_PORT, LLM_HTTP_PORT and LLM_REPLICAS where they are set."""
    flow = copy.deepcopy(flow)
    ports = flow["gateway"]["port"]
    for at, name in enumerate(PORTS):  # parsed and bounded as their declarations say (contract/settings.py)
        if settings.is_set(name, environ):
            ports[at] = settings.read(name, environ)
    if settings.is_set(REPLICAS, environ):
        replicas = settings.read(REPLICAS, environ)
        for executor in flow["executors"]:
            if "replicas" in executor:  # the generating deployments (the embedder runs once)
                executor["replicas"] = replicas
    return flow


def write_flow(flow_file: str, models: list[str], out: Path, environ: Optional[dict] = None) -> str:
    """The Flow file to run: `flow_file` itself when no variable changes it, else a copy (written to
    `out`) with the environment's ports and replicas and one deployment per model."""
    environ = environ if environ is not None else dict(os.environ)
    flow = yaml.safe_load(Path(flow_file).read_text())
    changed = with_environment(with_models(flow, models) if models else flow, environ)
    if changed == flow:
        return flow_file
    out.write_text(yaml.safe_dump(changed, sort_keys=False))
    return str(out)
