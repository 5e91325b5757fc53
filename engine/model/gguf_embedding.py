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


class BlockRows(nn.Module):
    """An embedding's lookup from int steps and per-block scales (and lows): scale * step + low in
    fp32 (`gguf_types.affine`), times the embedding's scale where it has one (Gemma's scaled
    embedding multiplies its rows by `embed_scale`, in the weight's dtype). It takes the place of
    the model's embedding (placement.put)."""

    steps: torch.Tensor
    scales: torch.Tensor
    lows: Optional[torch.Tensor]
    embed_scale: Optional[torch.Tensor]

    def __init__(self, like: nn.Embedding, exact: Exact, order: Optional[torch.Tensor]):
        """like: the embedding it replaces; its rows are `exact`'s, in `order` where given."""
        super().__init__()
        self.num_embeddings, self.embedding_dim, self.padding_idx = like.num_embeddings, like.embedding_dim, \
            like.padding_idx
        pick = (lambda t: t) if order is None else (lambda t: t[order])
        self.register_buffer("steps", pick(torch.from_numpy(exact.steps)).contiguous(), persistent=False)
        self.register_buffer("scales", pick(torch.from_numpy(exact.scale)).contiguous(), persistent=False)
        lows = None if exact.low is None else pick(torch.from_numpy(exact.low)).contiguous()
        self.register_buffer("lows", lows, persistent=False)
        self.sub = exact.sub
        # an empty placeholder: nothing in a forward reads the table but the lookup (its dtype at most)
        self.weight = nn.Parameter(torch.empty(0, like.embedding_dim, dtype=like.weight.dtype), requires_grad=False)
        scale = getattr(like, "embed_scale", None)
        self.register_buffer("embed_scale", None if scale is None else scale.detach().to(like.weight.dtype).clone(),
                             persistent=False)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        rows = affine(self.steps[input], self.scales[input], None if self.lows is None else self.lows[input], self.sub)
        return rows if self.embed_scale is None else rows * self.embed_scale
