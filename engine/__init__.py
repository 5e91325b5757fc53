"""The decoding engine: plain torch + transformers, no jina or docarray (a test keeps it so).

It stands on the request contract (`contract`: SamplingParams, EngineConfig, the errors and
limits), which every other layer shares without loading the engine.
"""
from . import torch_vectors

torch_vectors.pin()  # before PyTorch's first operation: the same bits on every x86 CPU

from .client.async_engine import AsyncEngine, EngineClient
from .client.engine_process import EngineProcess
from .model.loader import LoadedModel, load_model
from .outputs import RequestOutput

__all__ = ["AsyncEngine", "EngineClient", "EngineProcess", "LoadedModel", "RequestOutput", "load_model"]
