"""A GGUF's embedding table kept as the file's blocks: each looked-up row is dequantized when it
is looked up, by `gguf_types.affine`, which `gguf_types.weights` uses for the whole table.

A step looks up one row per token, so the table need not be fp32 in memory. Gemma 3's is
262,144 × 640: 671 MB in fp32, 178 MB as the file's Q8_0 blocks (which the output layer, tied
to it, keeps separately in its own layout). The rows come out bit for bit as the fp32 table's.
"""
from typing import Optional

import torch
from torch import nn

from .gguf_types import Exact, affine


class BlockRows(nn.Embedding):
    """nn.Embedding's lookup from int steps and per-block scales (and lows): scale * step + low in
    fp32 (`gguf_types.affine`). Placed before nn.Embedding in a model's own embedding class
    (Gemma's scaled one calls nn.Embedding's forward through super())."""

    steps: torch.Tensor
    scales: torch.Tensor
    lows: Optional[torch.Tensor]
    sub: int

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return affine(self.steps[input], self.scales[input], None if self.lows is None else self.lows[input], self.sub)


def keep_rows(module: nn.Embedding, exact: Exact, order: Optional[torch.Tensor]) -> None:
    """Make `module` look its rows up from `exact`'s blocks (its rows in `order`, where given).
    Its weight becomes an empty placeholder: nothing in a forward reads the table but the lookup
    (a scaled embedding reads the weight's dtype only)."""
    pick = (lambda t: t) if order is None else (lambda t: t[order])
    module.register_buffer("steps", pick(torch.from_numpy(exact.steps)).contiguous(), persistent=False)
    module.register_buffer("scales", pick(torch.from_numpy(exact.scale)).contiguous(), persistent=False)
    lows = None if exact.low is None else pick(torch.from_numpy(exact.low)).contiguous()
    module.register_buffer("lows", lows, persistent=False)
    setattr(module, "sub", exact.sub)  # noqa: B010 - nn.Module's typed __setattr__
    module.weight = nn.Parameter(torch.empty(0, module.embedding_dim), requires_grad=False)
    cls = type(module)
    if cls is nn.Embedding:
        module.__class__ = BlockRows
    elif not issubclass(cls, BlockRows):
        module.__class__ = type(f"BlockRows{cls.__name__}", (cls, BlockRows), {})
