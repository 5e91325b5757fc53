"""What the service reports about a model: light to import, so that the executor's process,
which only relays a model that runs elsewhere, needs neither transformers' models nor the kernels."""
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ModelInfo:
    """What the service reports about its model, wherever the model runs."""

    device: str
    dtype: str
    max_context: int
    load_seconds: float
    kv_cache_dtype: str = "float32"  # what the KV cache holds keys and values in
    architecture: str = ""  # transformers' model_type: llama, gemma3, qwen2...
    parameters: int = 0
    weight_bytes: int = 0  # what the weights take in memory, as served (int4 blocks, fp32...)


def served_name(source: str) -> str:
    """The model id that APIs report: a local folder's (or .gguf file's) name, else the hub id."""
    path = Path(source)
    if path.exists():
        return path.stem if path.suffix == ".gguf" else path.resolve().name
    return source
