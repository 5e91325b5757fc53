"""How the engine's steps run a model, decided once at load and logged once.

Two step paths, no more:
- the C stack (c_stack.py): every decoder layer in llama_layer.c, one call a step, for models of
  Llama's and Gemma's shape whose projections are C products (a GGUF's blocks, int4);
- transformers' modules for the rest, their attention over the engine's paged pool
  (paged_attention.py, registered with transformers as an attention implementation), their
  products where the loader put the engine's own layers (fp32.py, int4.py).
"""
from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from ..kernels import native
from ..kernels.table import Op, choose
from . import c_stack
from .c_stack import CStack


@dataclass(frozen=True)
class Plan:
    """A model's step path, chosen at load: the runner reads `stack`, the log reads the rest."""

    stack: Optional[CStack]  # None: transformers' modules run the layers
    why: str  # why not the C stack ("" where it is)
    attention: str  # which attention the layers run

    @property
    def layers(self) -> str:
        return self.stack.describe() if self.stack is not None else f"transformers' modules, because {self.why}"

    def __str__(self) -> str:
        return f"decoder layers: {self.layers}; attention: {self.attention}"


def plan(model: nn.Module, device: torch.device, kv_dtype: torch.dtype, lora: bool = False) -> Plan:
    """The model's plan on `device`, its KV pool in `kv_dtype`; `lora`: it serves LoRA adapters."""
    if lora:
        stack, why = None, "LoRA adapters add their low-rank products beside the layers' (llama_layer.c has none)"
    elif device.type != "cpu":
        stack, why = None, f"the C layers run on CPU, not {device.type}"
    elif not (kv_dtype == torch.float32 or (kv_dtype == torch.float16 and native.kv_half_ready())):
        stack, why = None, f"llama_layer.c reads a KV cache of fp32 or fp16 (with F16C), not {kv_dtype}"
    else:
        stack, why = c_stack.build(model)
    if stack is not None:
        return Plan(stack, "", "in llama_layer.c, over the paged pool")
    return Plan(None, why, attention_path(device, kv_dtype))


def attention_path(device: torch.device, kv_dtype: torch.dtype) -> str:
    if device.type == "cuda":
        return "one padded SDPA call a step over the paged pool (decode steps replayed as CUDA graphs where they fit)"
    op = Op.PAGED_ATTENTION_FP16 if kv_dtype == torch.float16 else Op.PAGED_ATTENTION
    kernel = choose(op, "fp32", device.type)
    if kernel.c:
        return f"{op} in C over the paged pool"
    return f"one SDPA call per sequence over the paged pool ({kernel.why})"
