"""The engine's own decoder for models of Llama's and Gemma's shape whose projections are C
products: every decoder layer in llama_layer.c, the whole stack in one call per step.

A decode step of a small model is mostly Python when transformers' modules run it (some 4,500
PyTorch calls a step for SmolLM2-135M, against 210 int4 matmuls). Here a step is the embedding
lookup, the rotary tables, one `llama_layers` call over every layer, the final norm and the output
layer. Each layer is a `DecoderLayer`: the C layer's arguments, built once at load from the
model's config and weights, with the features of Llama's kin and Gemma as its flags:
Qwen2's q, k, v biases, Qwen3's and Gemma 3's q and k norms, Mistral's and Gemma's windows,
Phi-3's fused projections, Gemma's (1 + w) norms around each sublayer, GeGLU, Gemma 2's capped
scores and Gemma 3's local and global rotary tables.

The transformers model is read, never changed: its config, its layers' weights (the C products'
buffers, norms' weights, biases), and its embedding, rotary embedding and output layer, which are
called as they are. Its layers' own forward, with the same C products and the C norms and
activations in place of PyTorch's, computes the same numbers bit for bit: the tests' reference
(testing/native_reference.py).
"""
from dataclasses import dataclass
from typing import Any, Optional, cast

import torch
from torch import nn
from transformers.activations import GELUTanh, SiLUActivation
from transformers.models.gemma2 import modeling_gemma2 as gemma2
from transformers.models.gemma3 import modeling_gemma3 as gemma3
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaForCausalLM, LlamaModel
from transformers.models.mistral import modeling_mistral as mistral
from transformers.models.phi3 import modeling_phi3 as phi3
from transformers.models.qwen2 import modeling_qwen2 as qwen2
from transformers.models.qwen3 import modeling_qwen3 as qwen3

from ..kernels import llama_layer, native
from ..kernels.table import Op, choose
from .int4 import Int4Linear, Int8Linear
from .paged_attention import PagedStep

# Llama's kin: the same decoder layer, with features that llama_layer.c has too
LAYERS = (LlamaDecoderLayer, mistral.MistralDecoderLayer, qwen2.Qwen2DecoderLayer, qwen3.Qwen3DecoderLayer,
          phi3.Phi3DecoderLayer)
GEMMA_LAYERS = (gemma2.Gemma2DecoderLayer, gemma3.Gemma3DecoderLayer)  # norms after each sublayer too
STACKS = {LlamaForCausalLM: LlamaModel, mistral.MistralForCausalLM: mistral.MistralModel,
          qwen2.Qwen2ForCausalLM: qwen2.Qwen2Model, qwen3.Qwen3ForCausalLM: qwen3.Qwen3Model,
          phi3.Phi3ForCausalLM: phi3.Phi3Model, gemma2.Gemma2ForCausalLM: gemma2.Gemma2Model,
          gemma3.Gemma3ForCausalLM: gemma3.Gemma3TextModel}
ACTIVATIONS = {SiLUActivation: "silu", GELUTanh: "gelu_tanh"}  # transformers' module: llama_layer.ACTIVATIONS' name
QKV = ("q_proj", "k_proj", "v_proj")


@dataclass(frozen=True)
class Parts:
    """A Llama-shaped layer's projections, as its family names them."""

    qkv: list[Any]  # q, k, v: three layers, or Phi-3's one
    o: Any
    gate_up: list[Any]  # gate, up: two layers, or Phi-3's one
    down: Any
    act: Any  # the MLP's activation module


def _parts(layer: Any) -> Parts:
    attn, mlp = layer.self_attn, layer.mlp
    if hasattr(attn, "qkv_proj"):
        return Parts([attn.qkv_proj], attn.o_proj, [mlp.gate_up_proj], mlp.down_proj, mlp.activation_fn)
    return Parts([getattr(attn, n) for n in QKV], attn.o_proj, [mlp.gate_proj, mlp.up_proj], mlp.down_proj, mlp.act_fn)


@dataclass(frozen=True)
class DecoderLayer:
    """One decoder layer as llama_layer.c runs it: its arguments, the tensors they point at (kept
    alive here), and its features by name, for the load's log."""

    struct: llama_layer.Struct
    tensors: tuple[Optional[torch.Tensor], ...]
    features: frozenset[str]


@dataclass(frozen=True)
class CStack:
    """A model's decoder run by the engine: its layers in one llama_layers call per step, with the
    model's embedding, rotary embedding, final norm and output layer around them."""

    layers: list[DecoderLayer]
    array: Any  # the layers' structs, for llama_layers (llama_layer.llama_stack)
    embed: nn.Module
    rotary: nn.Module
    rope_kinds: Optional[list[str]]  # the rotary tables a step computes (Gemma 3's local, global); None: one
    norm: tuple[torch.Tensor, float]  # the final norm's scale (1 + w for Gemma) and epsilon
    head: nn.Module
    logit_cap: Optional[float]  # Gemma 2's final_logit_softcapping

    def describe(self) -> str:
        features = sorted(set().union(*(layer.features for layer in self.layers)))
        return f"{len(self.layers)} layers in llama_layer.c, one call a step" + (
            f" ({', '.join(features)})" if features else "")

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, step: PagedStep,
                keep: int | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the logits of the positions `keep` names (0: all), the decoder's output [1, tokens,
        hidden]): what the model's forward computes with its layers' C norms and activations
        (`logits_to_keep=keep`), bit for bit. The decoder's output is what a prompt's scores
        are computed from (prompt_logprobs.py)."""
        hidden = self.embed(ids)
        tables = ([self.rotary(hidden, positions)] if self.rope_kinds is None
                  else [self.rotary(hidden, positions, kind) for kind in self.rope_kinds])
        out = llama_layer.llama_layers(self.array, step.native_step, tables, hidden, *step.pool.all_layers())
        if out is None:
            raise RuntimeError("llama_layer.c refused a step's tensors that the load planned it for")
        step.counted.extend(range(len(self.layers)))
        normed = native.rms_norm(out, *self.norm)
        assert normed is not None, "the C norm runs wherever the C layers do"
        logits = self.head(normed if isinstance(keep, int) else normed[:, keep])
        if self.logit_cap is not None:  # Gemma 2's, in its forward's operations
            logits = logits / self.logit_cap
            logits = torch.tanh(logits)
            logits = logits * self.logit_cap
        return logits, normed


def build(model: nn.Module) -> tuple[Optional[CStack], str]:
    """(the model's decoder in C, or None and why not)."""
    decoder: Any = getattr(model, "model", None)
    if type(model) not in STACKS or type(decoder) is not STACKS[type(model)]:
        return None, (f"{type(model).__name__} is not of Llama's or Gemma's shape (Llama, Mistral, Qwen2, Qwen3, "
                      f"Phi-3, Gemma 2, Gemma 3), the only ones in C so far")
    kernel = choose(Op.DECODER_LAYERS, "int4")
    if not kernel.c:
        return None, f"llama_layer.c does not run here: {kernel.why}"
    decoder = cast(Any, decoder)  # of STACKS' type
    layers: list[Any] = list(decoder.layers)
    if len(layers) != cast(Any, model).config.num_hidden_layers:
        return None, "its decoder's layers are not its config's"
    if why := _misfit(layers[0]):
        return None, why
    rope_kinds = _rope_kinds(model)
    built = []
    for layer in layers:
        if why := _misfit(layer):
            return None, why
        one = _layer(layer, rope_kinds)
        if one is None:
            return None, "llama_layer.c does not take its tensors"
        built.append(one)
    gemma = type(layers[0]) in GEMMA_LAYERS
    return CStack(built, llama_layer.llama_stack([b.struct for b in built]), decoder.embed_tokens, decoder.rotary_emb,
                  rope_kinds, (norm_scale(decoder.norm, gemma), _eps(decoder.norm, gemma)),
                  cast(Any, model).lm_head, getattr(cast(Any, model).config, "final_logit_softcapping", None)), ""


def _misfit(layer: Any) -> Optional[str]:
    """What keeps a decoder layer out of llama_layer.c (None: nothing)."""
    if type(layer) not in (*LAYERS, *GEMMA_LAYERS):
        return f"its {type(layer).__name__} is not a layer of Llama's or Gemma's shape"
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
    if type(parts.act) not in ACTIVATIONS:
        return f"its activation is {type(parts.act).__name__}, not SiLU or GELU's tanh approximation"
    return None


def window(attn: Any) -> int:
    """An attention module's sliding window in keys (0: none), as the model's forward passes it."""
    found = attn.sliding_window if hasattr(attn, "sliding_window") else getattr(attn.config, "sliding_window", None)
    return int(found or 0)


def layer_windows(model: nn.Module) -> tuple[int, ...]:
    """Each decoder layer's sliding window in keys (0: none), by its attention's layer_idx: the
    window its forward passes to the paged attention (the KV pool keeps such layers apart)."""
    attentions: list[Any] = [m.self_attn for m in model.modules() if hasattr(m, "self_attn") and hasattr(m, "mlp")]
    found = {int(attn.layer_idx): window(attn) for attn in attentions if getattr(attn, "layer_idx", None) is not None}
    count = cast(Any, model).config.get_text_config().num_hidden_layers
    return tuple(found.get(i, 0) for i in range(count))


def _rope_kinds(model: nn.Module) -> Optional[list[str]]:
    """The layer types whose rotary tables a step computes, in the order the C layers' `rope`
    names them (Gemma 3's local and global ones); None: one table for every layer."""
    if type(getattr(model, "model", None)) is not gemma3.Gemma3TextModel:
        return None
    return sorted(set(cast(Any, model).config.layer_types))


def norm_scale(norm: Any, gemma: bool) -> torch.Tensor:
    """A norm's scale as llama_layer.c multiplies by it: Gemma's is 1 + w, in fp32 as its forward adds it."""
    return (1.0 + norm.weight.detach().float()) if gemma else norm.weight.detach()


def _eps(norm: Any, gemma: bool) -> float:
    return float(norm.eps if gemma else norm.variance_epsilon)


def _layer(layer: Any, rope_kinds: Optional[list[str]]) -> Optional[DecoderLayer]:
    """The layer's arguments for llama_layer.c (None where it does not take them)."""
    attn, parts, config = layer.self_attn, _parts(layer), layer.self_attn.config
    gemma = type(layer) in GEMMA_LAYERS
    kv = config.num_key_value_heads * attn.head_dim
    qkv = _joined(parts.qkv, [config.num_attention_heads * attn.head_dim, kv, kv])
    gate_up = _joined(parts.gate_up, [config.intermediate_size] * 2)
    bias = None if parts.qkv[0].bias is None else torch.cat([p.bias.detach() for p in parts.qkv])
    norms = (layer.input_layernorm, layer.pre_feedforward_layernorm if gemma else layer.post_attention_layernorm)
    outs = (layer.post_attention_layernorm, layer.post_feedforward_layernorm) if gemma else None
    q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
    qk = None if q_norm is None else (norm_scale(q_norm, gemma), norm_scale(k_norm, gemma))
    out_scales = None if outs is None else (norm_scale(outs[0], gemma), norm_scale(outs[1], gemma))
    scales = (norm_scale(norms[0], gemma), norm_scale(norms[1], gemma))
    sizes = llama_layer.LlamaLayerSizes(config.hidden_size, config.num_attention_heads, config.num_key_value_heads,
                                   attn.head_dim, config.intermediate_size, attn.scaling)
    kin = llama_layer.LlamaKin(bias, qk, 0.0 if q_norm is None else _eps(q_norm, gemma), window(attn), out_scales,
                          0.0 if outs is None else _eps(outs[0], gemma), ACTIVATIONS[type(parts.act)],
                          0 if rope_kinds is None else rope_kinds.index(config.layer_types[attn.layer_idx]),
                          float(getattr(attn, "attn_logit_softcapping", None) or 0.0))
    struct = llama_layer.llama_layer_args(qkv, parts.o.weights, gate_up, parts.down.weights, scales,
                                     (_eps(norms[0], gemma), _eps(norms[1], gemma)), sizes, kin)
    if struct is None:
        return None
    kept = (bias, *scales, *(qk or ()), *(out_scales or ()))
    return DecoderLayer(struct, kept, _features(parts, kin, gemma, rope_kinds is not None))


def _joined(layers: list[Any], widths: list[int]) -> list[native.Weights]:
    """The layers' weights for one product over all of them, where they are of one kind (their
    packed buffers end to end, each layer's own buffers becoming views of those, so the weights
    are held once); else each layer's own, as llama_layer.c takes parts of different kinds.
    widths: the parts the joined outputs split into (q, k, v; gate, up)."""
    kinds = {(type(layer), layer.weights.kind, _lows(layer) is None) for layer in layers}
    if len(layers) == 1 or len(kinds) > 1:
        return [layer.weights for layer in layers]
    names = _buffer_names(layers[0])
    buffers = tuple(None if getattr(layers[0], name) is None else _end_to_end([getattr(layer, name) for layer in layers])
                    for name in names)
    start = 0
    for layer in layers:  # the engine's own product layers, not transformers' modules
        groups = getattr(layer, names[0]).shape[0]
        layer.adopt(*(None if joined is None else joined[start:start + groups] for joined in buffers))
        start += groups
    steps, scales, lows = buffers
    assert steps is not None and scales is not None and sum(widths) == sum(layer.out_features for layer in layers)
    if isinstance(layers[0], Int4Linear):
        assert lows is not None
        return [native.int4_weights(steps, scales, lows)]
    return [native.int8_weights(steps, scales, lows)]


def _end_to_end(parts: list[torch.Tensor]) -> torch.Tensor:
    """The parts joined along their first dimension: the tensor they are views of where they
    already lie end to end in one (joined before, and built again: shared_weights.py moved them),
    else a new one."""
    first, storage = parts[0], parts[0].untyped_storage()
    at = first.storage_offset()
    for part in parts:
        if (part.untyped_storage().data_ptr() != storage.data_ptr() or part.storage_offset() != at
                or not part.is_contiguous()):
            return torch.cat(parts)
        at += part.numel()
    rows = sum(part.shape[0] for part in parts)
    flat = torch.empty(0, dtype=first.dtype).set_(storage, first.storage_offset(), (at - first.storage_offset(),), (1,))
    return flat.view(rows, *first.shape[1:])


def _buffer_names(layer: Any) -> tuple[str, str, str]:
    """A C product layer's buffers, output groups first: steps, scales, lows."""
    return ("packed", "scale", "low") if isinstance(layer, Int4Linear) else ("weight_int8", "scales", "lows")


def _lows(layer: Any) -> Optional[torch.Tensor]:
    return getattr(layer, _buffer_names(layer)[2])


def _features(parts: Parts, kin: llama_layer.LlamaKin, gemma: bool, two_tables: bool) -> frozenset[str]:
    """The layer's features beyond Llama's: the C layer's flags that it sets, by name."""
    flags = {"q, k, v biases": kin.qkv_bias is not None, "q and k norms": kin.qk_norms is not None,
             "a sliding window": bool(kin.window), "fused projections": len(parts.qkv) == 1,
             "(1 + w) norms, after each sublayer too": gemma, "GeGLU": kin.act == "gelu_tanh",
             "capped scores": bool(kin.softcap), "local and global rotary tables": two_tables}
    return frozenset(name for name, on in flags.items() if on)

