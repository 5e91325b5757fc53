"""A model served in fp32 on CPU: its Linear layers' products in dense_matmul.c.

PyTorch's fp32 matmul on CPU sums a row in an order that depends on how many rows share the call
(on this project's EPYC, row 0 of every shape tried came out with other bits beside 3 or more rows
than beside 1). A model served in fp32, which is what any
Hugging Face model that is not 4-bit is on CPU, then gave other log probabilities batched than
alone, and a greedy answer could turn at a near-tie. dense_matmul.c sums each output in input
order whatever the batch, and a decode step's products (1 to 16 rows) run faster in it.

Each Linear and GPT-2 Conv1D becomes an Fp32Linear: its weight packed [outputs / 16][inputs][16],
the outputs padded to a multiple of 16 with zero weights, the bias added to the product. Where
every weight of a layer is a bf16 value (a checkpoint published in bf16, as most are, loaded in
fp32), it is packed as bf16: half the bytes for a step to read, the very same numbers.
"""
from typing import Optional

import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

from ..kernels import native
from .placement import put


class Fp32Linear(nn.Module):
    """y = x W^T + b with W packed for dense_matmul.c."""

    packed: torch.Tensor

    def __init__(self, weight: torch.Tensor, bias: Optional[torch.Tensor]):
        """weight [outputs, inputs] fp32 (a Linear's; a Conv1D's transposed)."""
        super().__init__()
        self.out_features, self.in_features = weight.shape
        channels = native.DENSE_CHANNELS
        padded = torch.zeros((-(-self.out_features // channels) * channels, self.in_features))
        padded[:self.out_features] = weight
        if torch.equal(padded.to(torch.bfloat16).float(), padded):
            padded = padded.to(torch.bfloat16)
        self.register_buffer("packed", padded.view(-1, channels, self.in_features).transpose(1, 2).contiguous())
        self.bias = bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        matmul = native.bf16_matmul if self.packed.dtype == torch.bfloat16 else native.fp32_matmul
        y = matmul(x.reshape(-1, self.in_features), self.packed)
        y = y[:, :self.out_features].reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias


def install(model: nn.Module) -> int:
    """Every fp32 Linear and Conv1D of the model on CPU as an Fp32Linear, where dense_matmul.c runs
    here; returns how many. Each layer is swapped at once, so its weight is held once, packed (an
    output layer tied to the embeddings keeps them beside its packed copy)."""
    if not native.fp32_ready():
        return 0
    swapped = 0
    for name, child in list(model.named_modules()):
        if type(child) not in (nn.Linear, Conv1D) or child.weight.dtype != torch.float32 \
                or child.weight.device.type != "cpu":
            continue
        weight, bias = child.weight.detach(), child.bias if isinstance(child.bias, torch.Tensor) else None
        put(model, name, Fp32Linear(weight.t() if type(child) is Conv1D else weight, bias))
        swapped += 1
    return swapped
