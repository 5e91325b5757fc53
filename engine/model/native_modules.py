"""The small modules of a decoder that llama_layer.c computes too (its norms and activations), as
modules computed by the same C functions.

Where whole decoder layers run in C, the model's own modules must round as that file does, so that
a forward through transformers' layers (a direct forward, the layers that do not run whole in C,
the final norm around them) computes the engine's numbers bit for bit. Each module keeps its
parameters and changes only its forward, and runs PyTorch's op where the C function cannot.
"""
from typing import Any

import torch
from torch import nn
from transformers.activations import GELUTanh, SiLUActivation
from transformers.models.gemma2 import modeling_gemma2 as gemma2
from transformers.models.gemma3 import modeling_gemma3 as gemma3
from transformers.models.llama.modeling_llama import LlamaRMSNorm
from transformers.models.mistral import modeling_mistral as mistral
from transformers.models.phi3 import modeling_phi3 as phi3
from transformers.models.qwen2 import modeling_qwen2 as qwen2
from transformers.models.qwen3 import modeling_qwen3 as qwen3

from ..kernels import native

NORMS = (LlamaRMSNorm, mistral.MistralRMSNorm, qwen2.Qwen2RMSNorm, qwen3.Qwen3RMSNorm,  # the same arithmetic
         phi3.Phi3RMSNorm)
GEMMA_NORMS = (gemma2.Gemma2RMSNorm, gemma3.Gemma3RMSNorm)  # x / rms(x) * (1 + w)


class NativeRMSNorm(LlamaRMSNorm):
    """LlamaRMSNorm computed by llama_layer.c's own function."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        out = native.rms_norm(hidden_states, self.weight, self.variance_epsilon)
        return super().forward(hidden_states) if out is None else out


class NativeGemmaRMSNorm(gemma3.Gemma3RMSNorm):
    """Gemma's RMSNorm, whose scale is 1 + w, computed by llama_layer.c's function with that
    scale (`plus_one`, 1 + w in fp32 as Gemma's forward adds it, made once)."""

    plus_one: torch.Tensor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = native.rms_norm(x, self.plus_one, self.eps)
        return super().forward(x) if out is None else out


class NativeSiLU(nn.Module):
    """SiLU computed by llama_layer.c's own function."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = native.silu(x)
        return nn.functional.silu(x) if out is None else out


class NativeGELUTanh(nn.Module):
    """GELU's tanh approximation (Gemma's GeGLU) computed by llama_layer.c's own function."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = native.gelu_tanh(x)
        return nn.functional.gelu(x, approximate="tanh") if out is None else out


# each activation llama_layer.c computes: transformers' module and the native one, by native.ACTIVATIONS' name
ACTIVATIONS: dict[type, tuple[str, type]] = {SiLUActivation: ("silu", NativeSiLU), NativeSiLU: ("silu", NativeSiLU),
                                             GELUTanh: ("gelu_tanh", NativeGELUTanh),
                                             NativeGELUTanh: ("gelu_tanh", NativeGELUTanh)}


def convert(model: nn.Module, activations: list[tuple[Any, str]]) -> None:
    """Every norm of the model, and each (module, attribute) activation given, becomes its native
    module: the same parameters, another forward."""
    module: Any
    for module in model.modules():
        if type(module) in NORMS:
            module.__class__ = NativeRMSNorm
        elif type(module) in GEMMA_NORMS:
            module.__class__ = NativeGemmaRMSNorm
            module.plus_one = 1.0 + module.weight.detach().float()
    for owner, name in activations:
        setattr(owner, name, ACTIVATIONS[type(getattr(owner, name))][1]())


def is_native(module: Any) -> bool:
    """Whether the module is computed by llama_layer.c's functions."""
    return type(module) in (NativeRMSNorm, NativeGemmaRMSNorm, NativeSiLU, NativeGELUTanh)
