"""The decoding engine: plain torch + transformers, no jina or docarray (a test keeps it so).

Names are resolved on first use (PEP 562), so that `executors.engine.limits` and
`executors.engine.params`, which import nothing heavy, can be read by the gateway and the
schemas without loading torch.
"""
from importlib import import_module
from typing import Any

_WHERE = {
    "AsyncEngine": "async_engine", "EngineClient": "async_engine", "EngineProcess": "engine_process",
    "StreamChunk": "streams",
    "ErrorKind": "errors", "GenerationError": "errors",
    "LoadedModel": "loader", "load_model": "loader",
    "EngineConfig": "params", "EngineDeadError": "params", "FinishReason": "params",
    "OverloadedError": "params", "SamplingParams": "params", "ValidationError": "params",
    "RequestLimits": "limits",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f".{_WHERE[name]}", __name__), name)
