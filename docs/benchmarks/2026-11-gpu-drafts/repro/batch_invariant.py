"""A row's numbers on a GPU, whatever shares its step: the module that was measured and not kept.

It sat in engine/model/ with an option `batch_invariant` (on by default on a GPU), applied by the
loader after the model was on the GPU. The products and norms became batch-invariant (probe.py),
but the attention did not, so the engine's tests still failed, and without the tiles the engine
made 1.02x to 1.26x the tokens (../README.md). Kept here so that the figures can be reproduced.

cuBLAS picks a kernel by a product's shape, and its kernels sum in different orders: on an H100 one
row of a Linear gave other bits when 2 or 40 rows shared the call (fp32 at almost every row count,
bf16 in GPT-2's output layer; docs/benchmarks/archive/2026-11-gpu-graphs/matmul-probe.txt). PyTorch's row
reductions (an RMSNorm's mean) size their thread blocks by the number of rows too, so the norms
were tiled as well (the probe then found them invariant on the H100 without tiles). So batched == alone, cached == uncached and speculative == plain failed on a GPU.

Here the Linear, Conv1D and RMSNorm layers compute in tiles of TILE_ROWS rows, the last one padded
with zeros: the library sees one shape whatever the step holds, and within one kernel a row's sums
do not depend on the rows beside it. The model's own forward (generate) goes through the same
layers, so it computes the engine's numbers.
"""
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from transformers.pytorch_utils import Conv1D

TILE_ROWS = 64  # a step of up to 64 rows is one launch per layer, as without tiles


def in_tiles(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """fn over x's rows (all but the last dimension), TILE_ROWS rows at a time."""
    flat = x.reshape(-1, x.shape[-1])
    rows = flat.shape[0]
    if rows == 0:
        out = fn(flat)
    else:
        padded = F.pad(flat, (0, 0, 0, -rows % TILE_ROWS))
        out = torch.cat([fn(tile) for tile in padded.split(TILE_ROWS)])[:rows]
    return out.reshape(*x.shape[:-1], out.shape[-1])


class Tiled:
    """A layer's own forward, called in tiles of rows (set on the instance, so hooks still run)."""

    def __init__(self, forward: Callable[[torch.Tensor], torch.Tensor]):
        self.forward = forward

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return in_tiles(self.forward, x)


def tiled_layer(module: nn.Module) -> bool:
    """The layers whose rows a GPU computes by their neighbours: products and root-mean-square norms
    (LayerNorm's CUDA kernel gives each row one block of a fixed size)."""
    return isinstance(module, (nn.Linear, Conv1D)) or type(module).__name__.endswith("RMSNorm")


def make_batch_invariant(model: nn.Module) -> int:
    """Every such layer of the model computes in tiles of rows; returns how many."""
    layers = [module for module in model.modules() if tiled_layer(module) and not isinstance(module.forward, Tiled)]
    for module in layers:
        module.forward = Tiled(module.forward)
    return len(layers)
