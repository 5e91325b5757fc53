"""The decoding engine: plain torch + transformers, no jina or docarray (a test keeps it so).

It stands on the request contract (`contract`: SamplingParams, EngineConfig, the errors and
limits), which every other layer shares without loading the engine.

The public names load their modules when first used: the executor's process relays a model that
runs in a process of its own, and importing the engine core, the kernels and transformers' models
there cost each Flow's start about 4 s of CPU.
"""
import importlib
from typing import TYPE_CHECKING, Any

from . import torch_vectors, transformers_index

torch_vectors.pin()  # before PyTorch's first operation: the same bits on every x86 CPU
transformers_index.install()  # before transformers' first import: its index read, not made

if TYPE_CHECKING:
    from .embedder_info import EmbedderInfo, describe_embedder
    from .embeddings import Embedder
    from .frontend.ahead import claim_ahead
    from .frontend.async_engine import EngineClient
    from .frontend.engine_process import EngineProcess
    from .frontend.in_process import AsyncEngine
    from .frontend.lifecycle import ModelLifecycle, ModelState
    from .frontend.spare import CoreProcess, SpareCore, spawn_core
    from .model.info import served_name
    from .model.loader import LoadedModel, load_model
    from .observer import EngineObserver
    from .outputs import PromptScores, RequestOutput

# the engine's public face, what the executors (and anything else outside) may use: name -> module
_PUBLIC = {"AsyncEngine": ".frontend.in_process", "Embedder": ".embeddings", "EmbedderInfo": ".embedder_info",
           "EngineClient": ".frontend.async_engine", "EngineObserver": ".observer", "EngineProcess": ".frontend.engine_process",
           "LoadedModel": ".model.loader", "ModelLifecycle": ".frontend.lifecycle", "ModelState": ".frontend.lifecycle",
           "PromptScores": ".outputs", "RequestOutput": ".outputs", "load_model": ".model.loader",
           "served_name": ".model.info", "SpareCore": ".frontend.spare", "CoreProcess": ".frontend.spare",
           "spawn_core": ".frontend.spare", "claim_ahead": ".frontend.ahead", "describe_embedder": ".embedder_info"}
__all__ = ["AsyncEngine", "CoreProcess", "Embedder", "EmbedderInfo", "EngineClient", "EngineObserver", "EngineProcess",
           "LoadedModel", "ModelLifecycle", "ModelState", "PromptScores", "RequestOutput", "SpareCore", "load_model",
           "served_name", "spawn_core", "claim_ahead", "describe_embedder"]
assert sorted(__all__) == sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_PUBLIC[name], __name__), name)
