"""Where the engine's own layers enter a transformers model: one function, `put`.

The loader serves a model's products in the engine's layers (fp32.py's dense products, int4.py's
and a GGUF's block products, gguf_embedding.py's block rows). Each replaces a child module of
the model (a Linear, a Conv1D, an Embedding) through nn.Module's child registry, as transformers'
own quantizer integrations replace Linear layers. Nothing else of a transformers module is
assigned: no forward, no class, no attribute (a test scans the engine for any other way).
"""
from torch import nn


def put(model: nn.Module, name: str, layer: nn.Module) -> None:
    """Make `layer`, one of the engine's own modules, the model's child at `name` (dotted)."""
    if not type(layer).__module__.startswith("engine."):
        raise TypeError(f"{name}: only the engine's own layers are put into a model, not {type(layer).__name__}")
    parent_name, _, leaf = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    if not isinstance(getattr(parent, leaf, None), nn.Module):
        raise KeyError(f"{name}: the model has no module there to replace")
    parent.register_module(leaf, layer)
