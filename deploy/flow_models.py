"""A Flow that serves several models: `LLM_MODELS=a,b make serve`.

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

GENERATING = "llm"


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


def write_flow(flow_file: str, models: list[str], out: Path) -> str:
    """The Flow file to run: `flow_file` itself for no models, else a copy with one deployment each."""
    if not models:
        return flow_file
    flow = yaml.safe_load(Path(flow_file).read_text())
    out.write_text(yaml.safe_dump(with_models(flow, models), sort_keys=False))
    return str(out)
