"""A leaner decoder layer in the engine's steps, for models of Llama's and Gemma's shape whose
projections run in the C products: the same numbers, fewer calls.

A decode step of a small model is mostly Python: transformers' modules make some 4,500 PyTorch
calls a step for SmolLM2-135M, against 210 int4 matmuls. In the engine's steps (where the
`paged` argument is given), each decoder layer of LAYERS (Llama and its kin: Mistral, Qwen2,
Qwen3, Phi-3) and GEMMA_LAYERS (Gemma 2, Gemma 3) runs its own forward instead:

- where the C kernels are built, the whole layer is one call to llama_layer.c, whatever GGUF
  kind each projection keeps (Q4_0 and Q4_1, Q4_K, Q5_0, Q8_0, Q6_K...). The model's norms and
  activations become that file's functions everywhere (native_modules.py), and it does the rest
  as PyTorch does, so transformers' forward of the same model gives the same numbers bit for bit;
- otherwise, for Llama's kin with int4 layers, in Python: q, k and v come from one int4 call
  over the three layers' packed weights laid end to end, and gate and up from another.
  quant_matmul.c computes each group of 16 outputs alone, so these are bit for bit the three
  (two) calls' results. The norms, rotary embedding, activation and residual sums are the
  modules' own functions and tensor operations, called directly rather than through nn.Module:
  the same numbers. Attention is paged_attention.py's, as transformers would call it.

Where every layer runs in C, `forward` takes a step's whole stack in one call, with the
embeddings, rotary tables, final norm and output layer of the model around it.

Outside the engine's steps (a direct forward, generate), the layer's own forward runs. Where a
layer is of neither shape, or its projections are not C products, nothing changes.
"""
import types
from dataclasses import dataclass
from typing import Any, Optional, cast

import torch
from torch import nn
from transformers.models.gemma2 import modeling_gemma2 as gemma2
from transformers.models.gemma3 import modeling_gemma3 as gemma3
from transformers.models.llama.modeling_llama import (
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaModel,
    apply_rotary_pos_emb,
)
from transformers.models.mistral import modeling_mistral as mistral
from transformers.models.phi3 import modeling_phi3 as phi3
from transformers.models.qwen2 import modeling_qwen2 as qwen2
from transformers.models.qwen3 import modeling_qwen3 as qwen3

from ..kernels import native
from ..kernels.table import Op, choose
from . import native_modules
from .int4 import Int4Linear, Int8Linear
from .native_modules import ACTIVATIONS
from .paged_attention import PagedStep, paged_attention

# Llama's kin: the same decoder layer, with features that llama_layer.c has too (native.LlamaKin):
# Qwen2's q, k, v biases, Qwen3's q and k norms, Mistral's (and Qwen's sliding layers') window, and
# Phi-3's q, k, v and gate, up projections, fused as llama_layer.c joins them anyway
LAYERS = (LlamaDecoderLayer, mistral.MistralDecoderLayer, qwen2.Qwen2DecoderLayer, qwen3.Qwen3DecoderLayer,
          phi3.Phi3DecoderLayer)
# Gemma's layers run whole in C too (not in the Python lean forward): each sublayer's output normed
# before its sum, norms that scale by 1 + w, GeGLU, Gemma 2's capped scores, Gemma 3's q and k norms
# and its local and global rotary tables
GEMMA_LAYERS = (gemma2.Gemma2DecoderLayer, gemma3.Gemma3DecoderLayer)
STACKS = {LlamaForCausalLM: LlamaModel, mistral.MistralForCausalLM: mistral.MistralModel,
          qwen2.Qwen2ForCausalLM: qwen2.Qwen2Model, qwen3.Qwen3ForCausalLM: qwen3.Qwen3Model,
          phi3.Phi3ForCausalLM: phi3.Phi3Model, gemma2.Gemma2ForCausalLM: gemma2.Gemma2Model,
          gemma3.Gemma3ForCausalLM: gemma3.Gemma3TextModel}
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
    """Layers' packed weights end to end, for one product over all of them."""

    weights: native.Weights
    buffers: tuple[Optional[torch.Tensor], ...]  # what `weights` points at, kept alive here
    widths: list[int]  # each layer's outputs, in order
    bias: Optional[torch.Tensor] = None  # the layers' biases end to end (each has one, or none has)


def _buffers(layer: Any) -> tuple[str, str, str]:
    """A C product layer's buffers, output groups first: steps, scales, lows."""
    return ("packed", "scale", "low") if isinstance(layer, Int4Linear) else ("weight_int8", "scales", "lows")


def _join(layers: list[Any], widths: list[int]) -> Optional[Joined]:
    """The layers joined (`_joined`) where one product reads them all: the same kind of weights,
    lows in all or none; else None."""
    kinds = {(type(layer), layer.weights.kind, getattr(layer, _buffers(layer)[2]) is None) for layer in layers}
    return _joined(layers, widths) if len(kinds) == 1 else None


def _joined(layers: list[Any], widths: list[int]) -> Joined:
    """The layers' buffers end to end; each layer's own buffers become views of these, so the
    weights are held once (outputs are the layout's first dimension: each view is contiguous).
    widths: the parts the joined outputs split into (q, k, v; gate, up)."""
    names = _buffers(layers[0])
    buffers = tuple(None if getattr(layers[0], name) is None else torch.cat([getattr(layer, name) for layer in layers])
                    for name in names)
    start = 0
    for layer in layers:
        groups = getattr(layer, names[0]).shape[0]
        for name, joined in zip(names, buffers, strict=True):
            if joined is not None:
                setattr(layer, name, joined[start:start + groups])
        if isinstance(layer, Int4Linear):
            layer.weights = native.int4_weights(layer.packed, layer.scale, layer.low)
        start += groups
    bias = torch.cat([layer.bias.detach() for layer in layers]) if layers[0].bias is not None else None
    steps, scales, lows = buffers
    assert steps is not None and scales is not None
    if isinstance(layers[0], Int4Linear):
        assert lows is not None
        return Joined(native.int4_weights(steps, scales, lows), buffers, widths, bias)
    return Joined(native.int8_weights(steps, scales, lows), buffers, widths, bias)


def _int4(x: torch.Tensor, weights: native.Weights) -> torch.Tensor:
    return native.int4_matmul(x.reshape(-1, x.shape[-1]), weights).view(*x.shape[:-1], weights.outputs)


def _fits(layer: nn.Module) -> bool:
    return type(layer) in (*LAYERS, *GEMMA_LAYERS) and _misfit(layer) is None


def _misfit(layer: Any) -> Optional[str]:
    """What keeps a layer of Llama's (or Gemma's) shape out of llama_layer.c (None: nothing)."""
    parts = _parts(layer)
    for p in (*parts.qkv, parts.o, *parts.gate_up, parts.down):
        name = next(n for n, m in layer.named_modules() if m is p)
        if not isinstance(p, (Int4Linear, Int8Linear)) or not p.c_kernel:
            return f"its {name} is {type(p).__name__}, not a layer of the C products (a GGUF's blocks, int4)"
        if p.bias is not None and p not in parts.qkv:
            return f"its {name} has a bias"
    if len({p.bias is None for p in parts.qkv}) > 1:
        return "some of its q, k and v have a bias, not all"
    if getattr(layer.self_attn.config, "partial_rotary_factor", 1.0) != 1.0:
        return "its rotary embedding turns part of each head only"
    act = getattr(layer.mlp, parts.act)
    if type(act) not in ACTIVATIONS:
        return f"its activation is {type(act).__name__}, not SiLU or GELU's tanh approximation"
    return None


def _joinable(parts: Parts) -> bool:
    """Whether the Python lean forward takes the layer: every projection int4 with fp16 scales."""
    return all(isinstance(p, Int4Linear) and not p.wide for p in (*parts.qkv, parts.o, *parts.gate_up, parts.down))


def _qk_norms(attn: Any) -> tuple[Any, Any]:
    """The attention's q and k norms (Qwen3's, Gemma 3's), or (None, None)."""
    return getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)


def _window(attn: Any) -> int:
    """The attention's sliding window in keys (0: none), as the model's forward passes it."""
    window = attn.sliding_window if hasattr(attn, "sliding_window") else getattr(attn.config, "sliding_window", None)
    return int(window or 0)


def layer_windows(model: nn.Module) -> tuple[int, ...]:
    """Each decoder layer's sliding window in keys (0: none), by its attention's layer_idx: the
    window its forward passes to the paged attention (the KV pool keeps such layers apart)."""
    attentions: list[Any] = [m.self_attn for m in model.modules() if hasattr(m, "self_attn") and hasattr(m, "mlp")]
    found = {int(attn.layer_idx): _window(attn) for attn in attentions if getattr(attn, "layer_idx", None) is not None}
    count = cast(Any, model).config.get_text_config().num_hidden_layers
    return tuple(found.get(i, 0) for i in range(count))


def outside(model: nn.Module) -> Optional[str]:
    """Why the model's first decoder layer does not run in llama_layer.c (None: it does, or the
    model has no decoder layers): what the log names once at load."""
    layer = next((m for m in model.modules() if hasattr(m, "self_attn") and hasattr(m, "mlp")), None)
    if layer is None or _fits(layer):
        return None
    if type(layer) not in (*LAYERS, *GEMMA_LAYERS):
        return (f"{type(layer).__name__} is not a layer of Llama's or Gemma's shape (Llama, Mistral, Qwen2, Qwen3, "
                f"Phi-3, Gemma 2, Gemma 3), the only ones in C so far")
    return _misfit(layer) or "its layers do not fit llama_layer.c"


def native_ops(model: nn.Module) -> list[Any]:
    """Where the C kernels run, the model's norms and its fitting layers' activations become
    llama_layer.c's (native_modules.py), inside the whole-layer kernel and out of it alike.
    Returns the fitting layers."""
    layers: list[Any] = [module for module in model.modules() if _fits(module)]
    if layers and choose(Op.DECODER_LAYERS, "int4").c:
        native_modules.convert(model, [(layer.mlp, _parts(layer).act) for layer in layers])
    return layers


def install(model: nn.Module) -> int:
    """Give every fitting decoder layer the lean forward (after `native_ops`); returns how many got it."""
    layers = native_ops(model)
    tables = _rope_tables(model)
    for layer in layers:  # each gets attributes of its own
        attn, parts, config = layer.self_attn, _parts(layer), layer.self_attn.config
        kv = config.num_key_value_heads * attn.head_dim
        # one product for q, k, v and one for gate, up where each joins (all int4 for the Python lean forward)
        layer.lean_qkv = _join(parts.qkv, [config.num_attention_heads * attn.head_dim, kv, kv])
        layer.lean_gate_up = _join(parts.gate_up, [config.intermediate_size] * 2)
        layer.lean_python = type(layer) in LAYERS and _joinable(parts)
        # what the Python lean forward reads every step, found once (the activation by its name: a
        # module set as an attribute would become another child of the layer)
        layer.lean_act, layer.lean_window = parts.act, _window(attn) or None
        layer.lean_bias = _qkv_bias(layer, parts)
        layer.lean_native = _native(layer, tables)
        layer.full_forward = layer.forward
        layer.forward = types.MethodType(_forward, layer)
    setattr(model, "lean_stack", _stack(model))  # noqa: B010 - nn.Module's typed __setattr__
    setattr(model, "lean_tables", tables)  # noqa: B010
    return len(layers)


def _rope_tables(model: nn.Module) -> Optional[list[str]]:
    """The layer types whose rotary tables a step computes, in the order the C layers' `rope`
    names them (Gemma 3's local and global ones); None: one table for every layer."""
    config = getattr(model, "config", None)
    if type(getattr(model, "model", None)) is not gemma3.Gemma3TextModel or config is None:
        return None
    return sorted(set(config.layer_types))


def _qkv_bias(layer: Any, parts: Parts) -> Optional[torch.Tensor]:
    """q, k and v's biases end to end (kept here for the C layer), or None."""
    if layer.lean_qkv is not None:
        return layer.lean_qkv.bias
    return None if parts.qkv[0].bias is None else torch.cat([p.bias.detach() for p in parts.qkv])


def _stack(model: nn.Module) -> Optional[Any]:
    """All decoder layers for one llama_layers call per step, where every one runs in C and
    transformers' Llama (or its kin, or Gemma) is around them (embeddings, rotary embedding,
    final norm, output layer)."""
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
    in one C call: what the model's forward computes (LlamaForCausalLM, or its kin's or Gemma's,
    with `logits_to_keep=keep`, the layers' forward above), bit for bit, without Python between
    the layers. The decoder's output is what a prompt's scores are computed from
    (prompt_logprobs.py). None where the model has no such stack or the call does not take these
    tensors: the caller runs the model's forward."""
    stack = getattr(model, "lean_stack", None)
    if stack is None:
        return None
    decoder: Any = cast(Any, model).model
    hidden = decoder.embed_tokens(ids)
    kinds = getattr(model, "lean_tables", None)
    tables = ([decoder.rotary_emb(hidden, positions)] if kinds is None
              else [decoder.rotary_emb(hidden, positions, kind) for kind in kinds])
    out = native.llama_layers(stack, step.native_step, tables, hidden, *step.pool.all_layers())
    if out is None:
        return None
    step.counted.extend(range(len(stack)))
    hidden = decoder.norm(out)
    logits = cast(Any, model).lm_head(hidden if isinstance(keep, int) else hidden[:, keep])
    cap = getattr(cast(Any, model).config, "final_logit_softcapping", None)
    if cap is not None:  # Gemma 2's, in its forward's operations
        logits = logits / cap
        logits = torch.tanh(logits)
        logits = logits * cap
    return logits, hidden


def _native(layer: Any, tables: Optional[list[str]]) -> Optional[native.Struct]:
    """The layer for llama_layer.c, where it runs."""
    attn, mlp, parts, config = layer.self_attn, layer.mlp, _parts(layer), layer.self_attn.config
    gemma = type(layer) in GEMMA_LAYERS
    norms = (layer.input_layernorm, layer.pre_feedforward_layernorm if gemma else layer.post_attention_layernorm)
    outs = (layer.post_attention_layernorm, layer.post_feedforward_layernorm) if gemma else None
    q_norm, k_norm = _qk_norms(attn)
    if not all(native_modules.is_native(m) for m in (getattr(mlp, parts.act), *norms, *(outs or ()),
                                                        *(n for n in (q_norm, k_norm) if n is not None))):
        return None
    scale = (lambda norm: norm.plus_one if gemma else norm.weight)  # Gemma's norms scale by 1 + w
    eps = (lambda norm: norm.eps if gemma else norm.variance_epsilon)
    sizes = native.LlamaLayerSizes(config.hidden_size, config.num_attention_heads, config.num_key_value_heads,
                                   attn.head_dim, config.intermediate_size, attn.scaling)
    kin = native.LlamaKin(
        layer.lean_bias, None if q_norm is None else (scale(q_norm), scale(k_norm)),
        0.0 if q_norm is None else eps(q_norm), _window(attn),
        None if outs is None else (scale(outs[0]), scale(outs[1])), 0.0 if outs is None else eps(outs[0]),
        native_modules.ACTIVATIONS[type(getattr(mlp, parts.act))][0],
        0 if tables is None else tables.index(config.layer_types[attn.layer_idx]),
        float(getattr(attn, "attn_logit_softcapping", None) or 0.0))
    qkv = [layer.lean_qkv.weights] if layer.lean_qkv is not None else [p.weights for p in parts.qkv]
    gate_up = [layer.lean_gate_up.weights] if layer.lean_gate_up is not None else [p.weights for p in parts.gate_up]
    return native.llama_layer_args(qkv, parts.o.weights, gate_up, parts.down.weights,
                                   (scale(norms[0]), scale(norms[1])), (eps(norms[0]), eps(norms[1])), sizes, kin)


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
    if not lean.lean_python:  # not Llama's kin with int4 layers: the layer's own forward
        return lean.full_forward(hidden_states, *args, position_embeddings=position_embeddings, paged=paged,
                                 **kwargs)
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
