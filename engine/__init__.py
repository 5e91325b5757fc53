"""The decoding engine: plain torch + transformers, no jina or docarray (a test keeps it so).

It stands on the request contract (`contract`: SamplingParams, EngineConfig, the errors and
limits), which every other layer shares without loading the engine.
"""
from . import torch_vectors

torch_vectors.pin()  # before PyTorch's first operation: the same bits on every x86 CPU

from .embeddings import Embedder, EmbedderInfo
from .frontend.async_engine import AsyncEngine, EngineClient
from .frontend.engine_process import EngineProcess
from .frontend.lifecycle import ModelLifecycle, ModelState
from .model.loader import LoadedModel, load_model, served_name
from .observer import EngineObserver
from .outputs import RequestOutput
from .policies.prompt_logprobs import PromptScores

# the engine's public face: what the executors (and anything else outside) may use
__all__ = ["AsyncEngine", "Embedder", "EmbedderInfo", "EngineClient", "EngineObserver", "EngineProcess", "LoadedModel",
           "ModelLifecycle", "ModelState",
           "PromptScores", "RequestOutput", "load_model", "served_name"]
