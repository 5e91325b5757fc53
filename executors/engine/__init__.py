"""The decoding engine: plain torch + transformers, no jina or docarray (a test keeps it so)."""
from .async_engine import AsyncEngine, GenerationError, StreamChunk
from .loader import LoadedModel, load_model
from .params import (EngineConfig, EngineDeadError, FinishReason, OverloadedError,
                     SamplingParams, ValidationError)

__all__ = ["AsyncEngine", "EngineConfig", "EngineDeadError", "FinishReason", "GenerationError",
           "LoadedModel", "OverloadedError", "SamplingParams", "StreamChunk", "ValidationError",
           "load_model"]
