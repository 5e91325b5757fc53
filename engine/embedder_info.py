"""What the service says of its embedding model, read off the model's folder without loading it.

The embedding executor loads its model at the first embedding request (embeddings.py: PyTorch,
transformers and the weights, about 0.46 GB and 4 s of CPU on this project's 2-core machine), as
Ollama loads a model when a request names it. Listing the models (`/v1/models`, Ollama's
`/api/tags` and `/api/show`) needs the model's description before any embedding, so it is read
here from the files that sentence-transformers and transformers read: no PyTorch, milliseconds.
The loaded Embedder describes itself with this same function, so both say the same
(tests/unit/test_embedding_executor.py checks it on the bundled model).
"""
import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_MAX_TOKENS = 512  # a tokenizer without a length of its own, as sentence-transformers caps it
FLOATS = ("F32", "F16", "BF16", "F64")  # a weight's dtypes in safetensors (a stored int64 position_ids is none)


@dataclass(frozen=True)
class EmbedderInfo:
    """What the service says about its embedding model."""

    model_id: str
    dimensions: int
    max_tokens: int  # per input, special tokens included
    pooling: str
    normalized: bool
    load_seconds: float  # 0.0 until it has loaded
    architecture: str = ""  # transformers' model_type: bert...
    parameters: int = 0


def describe_embedder(source: str, load_seconds: float = 0.0) -> EmbedderInfo:
    """The model in folder `source` (or a hub id's, its config files fetched), from its config
    files; OSError or ValueError when it has none that says its width (not a model folder)."""
    folder = Path(source) if Path(source).is_dir() else _fetched(source)
    config: dict = _json(folder / "config.json", None)
    if not isinstance(config, dict) or "hidden_size" not in config:
        raise ValueError(f"{source}: no config.json with the model's hidden_size")
    sentence: dict = _json(folder / "sentence_bert_config.json", {})
    pooling: dict = _json(folder / "1_Pooling" / "config.json", {})
    modules: list = _json(folder / "modules.json", [])
    tokenizer: dict = _json(folder / "tokenizer_config.json", {})
    max_tokens = int(sentence.get("max_seq_length") or min(int(tokenizer.get("model_max_length") or 10**30),
                                                             DEFAULT_MAX_TOKENS))
    mode = next((mode for mode in ("cls", "max", "mean") if pooling.get(f"pooling_mode_{mode}_token")), "mean")
    normalized = any(m.get("type", "").endswith("Normalize") for m in modules)
    return EmbedderInfo(folder.resolve().name, int(config["hidden_size"]), max_tokens, mode, normalized,
                        load_seconds, str(config.get("model_type", "")), _parameters(folder))


def _fetched(repo: str) -> Path:
    """A hub model's config files, fetched (or found in the hub's cache): its folder."""
    from huggingface_hub import snapshot_download
    return Path(snapshot_download(repo, allow_patterns=["*.json", "*/config.json"]))


def _parameters(folder: Path) -> int:
    """The weights' count in the folder's safetensors files (their headers alone); 0 without any."""
    total = 0
    for file in sorted(folder.glob("*.safetensors")):
        with open(file, "rb") as data:
            (size,) = struct.unpack("<Q", data.read(8))
            header = json.loads(data.read(size))
        total += sum(math.prod(t["shape"]) for name, t in header.items()
                     if name != "__metadata__" and t.get("dtype") in FLOATS)
    return total


def _json(path: Path, default: Any) -> Any:
    """A config file's content, or `default` where the folder has none."""
    return json.loads(path.read_text()) if path.exists() else default
