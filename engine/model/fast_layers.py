"""A leaner decoder layer for Llama-shaped int4 models in the engine's steps: the same numbers,
fewer calls.

A decode step of a small model is mostly Python: transformers' modules make some 4,500 PyTorch
calls a step for SmolLM2-135M, against 210 int4 matmuls. In the engine's steps (where the
`paged` argument is given), each LlamaDecoderLayer here (and each of its kin's: Mistral, Qwen2,
Qwen3, Phi-3, LAYERS) runs its own forward instead:

- where the C kernels are built, the whole layer is one call to llama_layer.c. The model's
  norms and SiLU become that file's functions everywhere (NativeRMSNorm, NativeSiLU), and it
  does the rest as PyTorch does, so transformers' forward of the same model gives the same
  numbers bit for bit;
- otherwise, in Python: q, k and v come from one int4 call over the three layers' packed weights
  laid end to end, and gate and up from another. quant_matmul.c computes each group of 16
  outputs alone, so these are bit for bit the three (two) calls' results. The norms, rotary
  embedding, activation and residual sums are the modules' own functions and tensor operations,
  called directly rather than through nn.Module: the same numbers. Attention is
  paged_attention.py's, as transformers would call it.

Where every layer runs in C, `forward` takes a step's whole stack in one call, with the
embeddings, final norm and output layer of the model around it.

Outside the engine's steps (a direct forward, generate), the layer's own forward runs. Where a
layer is not Llama's shape, or its projections are not C int4 layers, nothing changes.
"""
import types
from dataclasses import dataclass
from typing import Any, Optional, cast

import torch
from torch import nn
from transformers.activations import SiLUActivation
from transformers.models.llama.modeling_llama import (
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaModel,
    LlamaRMSNorm,
    apply_rotary_pos_emb,
)
from transformers.models.mistral import modeling_mistral as mistral
from transformers.models.phi3 import modeling_phi3 as phi3
from transformers.models.qwen2 import modeling_qwen2 as qwen2
from transformers.models.qwen3 import modeling_qwen3 as qwen3

from ..kernels import native
from ..kernels.table import Op, choose
from .int4 import Int4Linear
from .paged_attention import PagedStep, paged_attention

# Llama's kin: the same decoder layer, with features that llama_layer.c has too (native.LlamaKin):
# Qwen2's q, k, v biases, Qwen3's q and k norms, Mistral's (and Qwen's sliding layers') window, and
# Phi-3's q, k, v and gate, up projections, fused as llama_layer.c joins them anyway
LAYERS = (LlamaDecoderLayer, mistral.MistralDecoderLayer, qwen2.Qwen2DecoderLayer, qwen3.Qwen3DecoderLayer,
          phi3.Phi3DecoderLayer)
NORMS = (LlamaRMSNorm, mistral.MistralRMSNorm, qwen2.Qwen2RMSNorm, qwen3.Qwen3RMSNorm,  # the same arithmetic
         phi3.Phi3RMSNorm)
STACKS = {LlamaForCausalLM: LlamaModel, mistral.MistralForCausalLM: mistral.MistralModel,
          qwen2.Qwen2ForCausalLM: qwen2.Qwen2Model, qwen3.Qwen3ForCausalLM: qwen3.Qwen3Model,
          phi3.Phi3ForCausalLM: phi3.Phi3Model}
QKV = ("q_proj", "k_proj", "v_proj")


@dataclass(frozen=True)
class Parts:
    """A Llama-shaped layer's projections, as its family names them."""

    qkv: list[Any]  # q, k, v: three layers, or Phi-3's one
    o: Any
    gate_up: list[Any]  # gate, up: two layers, or Phi-3's one
    down: Any
    act: str  # the MLP's attribute that holds its activation


def _parts(layer: Any) -> Parts:
    attn, mlp = layer.self_attn, layer.mlp
    if hasattr(attn, "qkv_proj"):
        return Parts([attn.qkv_proj], attn.o_proj, [mlp.gate_up_proj], mlp.down_proj, "activation_fn")
    return Parts([getattr(attn, n) for n in QKV], attn.o_proj, [mlp.gate_proj, mlp.up_proj], mlp.down_proj, "act_fn")


@dataclass(frozen=True)
class Joined:
    """Layers' packed weights end to end, for one int4 call over all of them."""

    weights: native.Int4Weights
    buffers: tuple[torch.Tensor, ...]  # what `weights` points at, kept alive here
    widths: list[int]  # each layer's outputs, in order
    bias: Optional[torch.Tensor] = None  # the layers' biases end to end (each has one, or none has)


def _joined(layers: list[Int4Linear], widths: list[int]) -> Joined:
    """The layers' buffers end to end; each layer's own buffers become views of these, so the
    weights are held once (outputs are the layout's first dimension: each view is contiguous).
    widths: the parts the joined outputs split into (q, k, v; gate, up)."""
    names = ("packed", "scale", "low")
    buffers = tuple(torch.cat([getattr(layer, name) for layer in layers]) for name in names)
    start = 0
    for layer in layers:
        groups = layer.packed.shape[0]
        for name, joined in zip(names, buffers, strict=True):
            setattr(layer, name, joined[start:start + groups])
        layer.weights = native.int4_weights(layer.packed, layer.scale, layer.low)
        start += groups
    bias = torch.cat([layer.bias.detach() for layer in layers]) if layers[0].bias is not None else None
    return Joined(native.int4_weights(*buffers), buffers, widths, bias)


def _int4(x: torch.Tensor, weights: native.Int4Weights) -> torch.Tensor:
    return native.int4_matmul(x.reshape(-1, x.shape[-1]), weights).view(*x.shape[:-1], weights.outputs)


def _fits(layer: nn.Module) -> bool:
    return type(layer) in LAYERS and _misfit(layer) is None


def _misfit(layer: Any) -> Optional[str]:
    """What keeps a layer of Llama's shape out of llama_layer.c (None: nothing)."""
    parts = _parts(layer)
    for p in (*parts.qkv, parts.o, *parts.gate_up, parts.down):
        name = next(n for n, m in layer.named_modules() if m is p)
        if not isinstance(p, Int4Linear) or not p.c_kernel:
            return f"its {name} is {type(p).__name__}, not int4 with fp16 scales (Q4_0, Q4_1)"
        if p.wide:
            return f"its {name} has fp32 scales (Q4_K)"
        if p.bias is not None and p not in parts.qkv:
            return f"its {name} has a bias"
    if len({p.bias is None for p in parts.qkv}) > 1:
        return "some of its q, k and v have a bias, not all"
    if getattr(layer.self_attn.config, "partial_rotary_factor", 1.0) != 1.0:
        return "its rotary embedding turns part of each head only"
    return None


def _qk_norms(attn: Any) -> tuple[Any, Any]:
    """The attention's q and k norms (Qwen3's), or (None, None)."""
    return getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)


def _window(attn: Any) -> int:
    """The attention's sliding window in keys (0: none), as the model's forward passes it."""
    window = attn.sliding_window if hasattr(attn, "sliding_window") else getattr(attn.config, "sliding_window", None)
    return int(window or 0)


class NativeRMSNorm(LlamaRMSNorm):
    """LlamaRMSNorm computed by llama_layer.c's own function, so that a forward through
    transformers' layers rounds as the whole-layer kernel does (PyTorch's where that cannot run)."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        out = native.rms_norm(hidden_states, self.weight, self.variance_epsilon)
        return super().forward(hidden_states) if out is None else out


class NativeSiLU(nn.Module):
    """SiLU computed by llama_layer.c's own function (PyTorch's where that cannot run)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = native.silu(x)
        return nn.functional.silu(x) if out is None else out


def outside(model: nn.Module) -> Optional[str]:
    """Why the model's first decoder layer does not run in llama_layer.c (None: it does, or the
    model has no decoder layers): what the log names once at load."""
    layer = next((m for m in model.modules() if hasattr(m, "self_attn") and hasattr(m, "mlp")), None)
    if layer is None or _fits(layer):
        return None
    if type(layer) not in LAYERS:
        return (f"{type(layer).__name__} is not a layer of Llama's shape (Llama, Mistral, Qwen2, Qwen3, Phi-3), "
                f"the only ones in C so far")
    return _misfit(layer) or "its layers do not fit llama_layer.c"


def native_ops(model: nn.Module) -> list[Any]:
    """Where the C kernels run, the model's norms and its fitting layers' SiLU become
    llama_layer.c's (NativeRMSNorm, NativeSiLU), inside the whole-layer kernel and out of it
    alike. Returns the fitting layers."""
    layers: list[Any] = [module for module in model.modules() if _fits(module)]
    if layers and choose(Op.DECODER_LAYERS, "int4").c:
        for module in model.modules():
            if type(module) in NORMS:
                module.__class__ = NativeRMSNorm  # the same parameters and arithmetic, another forward
        for layer in layers:
            act = _parts(layer).act
            if type(getattr(layer.mlp, act)) is SiLUActivation:
                setattr(layer.mlp, act, NativeSiLU())
    return layers


def install(model: nn.Module) -> int:
    """Give every fitting decoder layer the lean forward (after `native_ops`); returns how many got it."""
    layers = native_ops(model)
    for layer in layers:  # each gets attributes of its own
        attn, parts, config = layer.self_attn, _parts(layer), layer.self_attn.config
        kv = config.num_key_value_heads * attn.head_dim
        layer.lean_qkv = _joined(parts.qkv, [config.num_attention_heads * attn.head_dim, kv, kv])
        layer.lean_gate_up = _joined(parts.gate_up, [config.intermediate_size] * 2)
        # what the Python lean forward reads every step, found once (the activation by its name: a
        # module set as an attribute would become another child of the layer)
        layer.lean_act, layer.lean_window = parts.act, _window(attn) or None
        layer.lean_native = _native(layer)
        layer.full_forward = layer.forward
        layer.forward = types.MethodType(_forward, layer)
    setattr(model, "lean_stack", _stack(model))  # noqa: B010 - nn.Module's typed __setattr__
    return len(layers)


def _stack(model: nn.Module) -> Optional[Any]:
    """All decoder layers for one llama_layers call per step, where every one runs in C and
    transformers' Llama (or its kin) is around them (embeddings, rotary embedding, final norm,
    output layer)."""
    decoder = getattr(model, "model", None)
    if type(model) not in STACKS or type(decoder) is not STACKS[type(model)]:
        return None
    layers: list[Any] = list(cast(Any, decoder).layers)
    if len(layers) != cast(Any, model).config.num_hidden_layers or any(getattr(x, "lean_native", None) is None for x in layers):
        return None
    return native.llama_stack([layer.lean_native for layer in layers])


def forward(model: nn.Module, ids: torch.Tensor, positions: torch.Tensor, step: PagedStep,
            keep: int | torch.Tensor) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
    """(the logits, the decoder's output [1, tokens, hidden]) of a step with every decoder layer
    in one C call: what the model's forward computes (LlamaForCausalLM with `logits_to_keep=keep`,
    the layers' forward above), bit for bit, without Python between the layers. The decoder's
    output is what a prompt's scores are computed from (prompt_logprobs.py). None where the model
    has no such stack or the call does not take these tensors: the caller runs the model's forward."""
    stack = getattr(model, "lean_stack", None)
    if stack is None:
        return None
    decoder: Any = cast(Any, model).model
    hidden = decoder.embed_tokens(ids)
    out = native.llama_layers(stack, step.native_step, decoder.rotary_emb(hidden, positions), hidden,
                              *step.pool.all_layers())
    if out is None:
        return None
    step.counted.extend(range(len(stack)))
    hidden = decoder.norm(out)
    return cast(Any, model).lm_head(hidden if isinstance(keep, int) else hidden[:, keep]), hidden


def _native(layer: Any) -> Optional[native.Struct]:
    """The layer for llama_layer.c, where it runs."""
    attn, mlp, norms = layer.self_attn, layer.mlp, (layer.input_layernorm, layer.post_attention_layernorm)
    qk_norms = _qk_norms(attn)
    parts = _parts(layer)
    if (type(getattr(mlp, parts.act)) is not NativeSiLU
            or any(type(n) is not NativeRMSNorm for n in (*norms, *(n for n in qk_norms if n is not None)))):
        return None
    config = attn.config
    sizes = native.LlamaLayerSizes(config.hidden_size, config.num_attention_heads, config.num_key_value_heads,
                                   attn.head_dim, config.intermediate_size, attn.scaling)
    q_norm, k_norm = qk_norms
    kin = native.LlamaKin(layer.lean_qkv.bias, None if q_norm is None else (q_norm.weight, k_norm.weight),
                          0.0 if q_norm is None else q_norm.variance_epsilon, _window(attn))
    return native.llama_layer_args(layer.lean_qkv.weights, parts.o.weights, layer.lean_gate_up.weights,
                                   parts.down.weights, (norms[0].weight, norms[1].weight),
                                   (norms[0].variance_epsilon, norms[1].variance_epsilon), sizes, kin)


def _forward(self: LlamaDecoderLayer, hidden_states: torch.Tensor, *args: Any,
             position_embeddings: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
             paged: Optional[PagedStep] = None, **kwargs: Any) -> torch.Tensor:
    """LlamaDecoderLayer.forward's numbers, with paged attention (see the module docstring)."""
    lean: Any = self  # install() gave it its attributes
    if paged is None or position_embeddings is None:
        return lean.full_forward(hidden_states, *args, position_embeddings=position_embeddings, paged=paged,
                                 **kwargs)
    if lean.lean_native is not None:
        out = native.llama_layer(lean.lean_native, paged.native_step, position_embeddings, hidden_states,
                                 *paged.pool.layer(self.self_attn.layer_idx))
        if out is not None:
            paged.counted.append(self.self_attn.layer_idx)
            return out
    attn, mlp, qkv, gate_up = self.self_attn, self.mlp, cast(Joined, lean.lean_qkv), cast(Joined, lean.lean_gate_up)
    shape = hidden_states.shape[:-1]
    joined = _int4(self.input_layernorm.forward(hidden_states), qkv.weights)
    q, k, v = (joined if qkv.bias is None else joined + qkv.bias).split(qkv.widths, dim=-1)
    q, k, v = (t.view(*shape, -1, attn.head_dim) for t in (q, k, v))
    q_norm, k_norm = _qk_norms(attn)
    if q_norm is not None:
        q, k = q_norm.forward(q), k_norm.forward(k)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    q, k = apply_rotary_pos_emb(q, k, *position_embeddings)
    out, _ = paged_attention(attn, q, k, v, None, scaling=attn.scaling, paged=paged,
                             sliding_window=lean.lean_window)
    hidden_states = hidden_states + attn.o_proj.forward(out.reshape(*shape, -1).contiguous())
    gate, up = _int4(self.post_attention_layernorm.forward(hidden_states), gate_up.weights).split(gate_up.widths,
                                                                                               dim=-1)
    return hidden_states + mlp.down_proj.forward(getattr(mlp, lean.lean_act)(gate) * up)
