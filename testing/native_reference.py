"""The tests' reference for the engine's C stack (engine/model/c_stack.py): transformers' own
decoder layers, with their norms and activations computed by llama_layer.c's functions.

The C stack computes what transformers' layers compute, except that its norms and activations
round as llama_layer.c's functions do. Give transformers' layers those same functions and their
forward must give the engine's numbers bit for bit: `reference_plan` loads a model that way
(every norm and activation module replaced by its native twin, the same parameters), and
serves it through transformers' modules, not the C stack.
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

from engine.kernels import native
from engine.model import plan as plans
from engine.model.c_stack import norm_scale

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


ACTIVATIONS: dict[type, type] = {SiLUActivation: NativeSiLU, GELUTanh: NativeGELUTanh}


def convert(model: nn.Module) -> None:
    """Every norm and activation of the model becomes its native twin: the same parameters,
    llama_layer.c's arithmetic."""
    module: Any
    for module in model.modules():
        if type(module) in NORMS:
            module.__class__ = NativeRMSNorm
        elif type(module) in GEMMA_NORMS:
            module.__class__ = NativeGemmaRMSNorm
            module.plus_one = norm_scale(module, gemma=True)  # the C stack's very scale
    for owner in list(model.modules()):
        for name, child in list(owner.named_children()):
            if type(child) in ACTIVATIONS:
                setattr(owner, name, ACTIVATIONS[type(child)]())


def reference_plan(model: nn.Module, device: torch.device, kv_dtype: torch.dtype, lora: bool = False) -> plans.Plan:
    """A stand-in for the loader's `plan`: the model's layers in transformers' modules, with the
    C norms and activations, never the C stack."""
    convert(model)
    return plans.Plan(None, "the test's reference", plans.attention_path(device, kv_dtype))


def as_the_engine_computes(model: nn.Module, stack_planned: bool) -> nn.Module:
    """The model, whose direct forward and generate compute what the engine's steps do, bit for
    bit: where the engine runs its C stack (`stack_planned`), its layers take the C norms and
    activations (`convert`); elsewhere the engine runs these very modules."""
    if stack_planned:
        convert(model)
    return model
