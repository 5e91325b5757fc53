"""llama_layer.c's Python side: whole decoder layers of Llama's shape (and its kin's: Qwen2, Qwen3,
Mistral, Phi-3, Gemma 2 and 3) in one call a step, with each projection's weights of any kind
(native.Weights) and the paged KV pools. c_stack.py builds the layers' structures once per model;
paged_attention.py builds a step's.
"""
import ctypes
from dataclasses import dataclass
from typing import Any, Optional

import torch

from . import build
from .native import Weights, cpu_fp32, kv_pool_fits, library

_Weight, LlamaLayer, LlamaStep = (build.STRUCTS[name] for name in ("Weight", "LlamaLayer", "LlamaStep"))
ACTIVATIONS = {"silu": build.CONSTANTS["ACT_SILU"], "gelu_tanh": build.CONSTANTS["ACT_GELU_TANH"]}  # kernels.h's ACT_*
Struct = ctypes.Structure  # a LlamaLayer or a LlamaStep, as annotations name them


@dataclass(frozen=True)
class LlamaLayerSizes:
    hidden: int
    heads: int
    kv_heads: int
    dim: int
    inter: int
    scale: float  # the attention's


@dataclass(frozen=True)
class LlamaKin:
    """What a Llama-shaped layer of another family adds (None, 0: not this one's)."""

    qkv_bias: Optional[torch.Tensor] = None  # [q, k, v outputs] (Qwen2)
    qk_norms: Optional[tuple[torch.Tensor, torch.Tensor]] = None  # [dim] each (Qwen3, Gemma 3)
    eps_qk: float = 0.0
    window: int = 0  # a sliding window in keys
    out_norms: Optional[tuple[torch.Tensor, torch.Tensor]] = None  # [hidden]: attention's, MLP's output (Gemma)
    eps_out: float = 0.0
    act: str = "silu"  # ACTIVATIONS' name
    rope: int = 0  # which rotary table of the step turns this layer (Gemma 3: its local or global one)
    softcap: float = 0.0  # attention scores' cap (Gemma 2)


def llama_layer_args(qkv: list[Weights], o: Weights, gate_up: list[Weights], down: Weights,
                     norms: tuple[torch.Tensor, torch.Tensor], eps: tuple[float, float],
                     sizes: LlamaLayerSizes, kin: LlamaKin = LlamaKin()) -> Optional[Struct]:
    """A layer for `llama_layers`, or None where it does not run here. qkv: q, k and v end to end in
    one part or three; gate_up likewise in one or two. The norms' weights (and the kin's tensors)
    must stay where they are (the caller keeps them), as the layers' buffers do."""
    extra = [t for t in (kin.qkv_bias, *(kin.qk_norms or ()), *(kin.out_norms or ())) if t is not None]
    if (library() is None or not cpu_fp32(*norms, *extra) or not all(t.is_contiguous() for t in (*norms, *extra))
            or not 1 <= len(qkv) <= 3 or not 1 <= len(gate_up) <= 2):
        return None
    weight = (lambda w: _Weight(w.packed, w.scale, w.low or None, w.width, w.outputs, w.kind))
    padded = (lambda ws, n: (_Weight * n)(*map(weight, ws)))  # absent parts: zeros, 0 outputs
    q_norm, k_norm = kin.qk_norms or (None, None)
    attn_out, mlp_out = kin.out_norms or (None, None)
    pointer = (lambda t: None if t is None else t.data_ptr())
    return LlamaLayer(padded(qkv, 3), weight(o), padded(gate_up, 2), weight(down), norms[0].data_ptr(),
                      norms[1].data_ptr(), eps[0], eps[1], sizes.scale, sizes.hidden, sizes.heads, sizes.kv_heads,
                      sizes.dim, sizes.inter, pointer(kin.qkv_bias), pointer(q_norm), pointer(k_norm), kin.eps_qk,
                      kin.window, pointer(attn_out), pointer(mlp_out), kin.eps_out, ACTIVATIONS[kin.act], kin.rope,
                      kin.softcap)


def llama_step(lengths: tuple[torch.Tensor, ...], block: int,
               groups: list[tuple[torch.Tensor, torch.Tensor, int]]) -> Struct:
    """A step for `llama_layers`: paged_attention's q_starts, q_lens, ctx_lens, and each KV cache group's
    slots [tokens] int64, tables [sequences, width] int32 and window (0: full attention). LlamaStep
    holds one group of each kind: llama_layer.c reads a layer with a window through the windowed
    group's, any other through the full group's. The caller keeps the tensors alive for the step."""
    by_kind = {bool(window): (slots, tables) for slots, tables, window in groups}
    assert len(by_kind) == len(groups) and False in by_kind, "one full group, and at most one windowed"
    (q_starts, q_lens, ctx_lens), (slots, tables), windowed = lengths, by_kind[False], by_kind.get(True)
    window = (windowed[0].data_ptr(), windowed[1].data_ptr(), windowed[1].shape[1]) if windowed else (None, None, 0)
    return LlamaStep(slots.data_ptr(), q_starts.data_ptr(), q_lens.data_ptr(), ctx_lens.data_ptr(),
                     tables.data_ptr(), slots.shape[0], tables.shape[0], tables.shape[1], block, *window)


Rotary = tuple[torch.Tensor, torch.Tensor]  # cos and sin [1, tokens, head_dim]


def llama_stack(layers: list[Struct]) -> Any:
    """A model's layers for `llama_layers`, in order, built once (a ctypes array)."""
    array: Any = LlamaLayer * len(layers)  # type: ignore[operator]
    return array(*layers)


def llama_layers(stack: Any, step: Struct, tables: list[Rotary], x: torch.Tensor, k_pools: list[torch.Tensor],
                 v_pools: list[torch.Tensor]) -> Optional[torch.Tensor]:
    """Every layer of `stack` for a step in one call (llama_layer.c): x [1, tokens, hidden] fp32 in,
    the last layer's output out; tables: the step's rotary tables (cos and sin), each layer's `rope`
    naming its own; k_pools and v_pools: each layer's keys and values (KVPool.all_layers), fp32 or
    fp16. None where the kernels do not take these tensors."""
    if len(k_pools) != len(stack) or len(v_pools) != len(stack):
        return None
    return _layers(stack, len(stack), stack[0], step, tables, x, k_pools, v_pools)


def _layers(layers: Any, count: int, first: Struct, step: Struct, tables: list[Rotary], x: torch.Tensor,
            k_pools: list[torch.Tensor], v_pools: list[torch.Tensor]) -> Optional[torch.Tensor]:
    built = library()
    cos, sin = ((table[0] if len(tables) == 1 else torch.stack(table)).float().contiguous()
                for table in zip(*tables, strict=True))
    half = k_pools[0].dtype == torch.float16
    if (built is None or not cpu_fp32(x) or not x.is_contiguous()
            or not all(kv_pool_fits(k, v) and k.is_contiguous() and v.is_contiguous() and (k.dtype == torch.float16) == half
                       for k, v in zip(k_pools, v_pools, strict=True))
            or x.shape[-1] != first.hidden or x.numel() != step.tokens * first.hidden
            or cos.shape[-2] != step.tokens or cos.shape[-1] != first.dim):
        return None
    pointers: Any = ctypes.c_void_p * count
    k_array, v_array = pointers(*(k.data_ptr() for k in k_pools)), pointers(*(v.data_ptr() for v in v_pools))
    out = torch.empty_like(x)
    status = built.llama_layers(layers, count, ctypes.byref(step), cos.data_ptr(), sin.data_ptr(), len(tables),
                                x.data_ptr(), out.data_ptr(), k_array, v_array, int(half), torch.get_num_threads())
    if status == -2:
        raise MemoryError("llama layer: out of memory")
    return out if status == 0 else None
