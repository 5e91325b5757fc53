"""The engine's C kernels (paged_attention.c, int4_matmul.c, int8_matmul.c, llama_layer.c,
greedy.c), compiled when the engine loads.

They are compiled on the machine that runs them, with its C compiler (`$CC`, else `cc`; `-O3
-march=native`), into a temporary file. That takes under a second. Nothing is cached on disk, so
a build never meets a CPU it was not made for. Where no compiler builds them, the wrappers return
None and their callers keep PyTorch's ops: paged_attention.py one SDPA call per sequence, int4.py
PyTorch's int4 and int8 kernels. All give the same guarantee (a row comes out as it does alone), only slower.
"""
import ctypes
import functools
import logging
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch

log = logging.getLogger(__name__)

SOURCES = tuple(Path(__file__).with_name(name) for name in ("paged_attention.c", "int4_matmul.c",
                                                                  "int8_matmul.c", "llama_layer.c", "greedy.c"))
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC")
_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
INT4_CHANNELS = 16  # int4_matmul.c's outputs per group
INT8_CHANNELS = 16  # int8_matmul.c's
_ACTIVATIONS = {1: "bf16", 2: "int8"}  # int4_matmul_ready()'s answers


@functools.cache
def library() -> Optional[ctypes.CDLL]:
    """The compiled kernels, or None (logged once) where they cannot be built."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        log.warning("no C compiler: the engine's C kernels are not built; PyTorch's ops run instead (slower)")
        return None
    started = time.perf_counter()
    try:
        built = _build(compiler)
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("C kernels not built (%s); PyTorch's ops run instead", exc)
        return None
    for function in (built.paged_attention, built.int4_matmul, built.int4_matmul_ready, built.int8_matmul,
                     built.int8_matmul_ready, built.llama_layer, built.greedy_ready, built.greedy_rows):
        function.restype = ctypes.c_int
    built.paged_attention.argtypes = [_PTR, _I64, _I64, *[_PTR] * 7, *[_I64] * 7, ctypes.c_float, ctypes.c_int]
    built.int4_matmul.argtypes = [_PTR] * 5 + [_I64] * 3 + [ctypes.c_int]
    built.int8_matmul.argtypes = [_PTR] * 4 + [_I64] * 3 + [ctypes.c_int]
    built.rms_norm_rows.restype = built.silu_rows.restype = None
    built.rms_norm_rows.argtypes = [_PTR] * 3 + [_I64] * 2 + [ctypes.c_float]
    built.silu_rows.argtypes = [_PTR] * 2 + [_I64] * 3
    built.greedy_rows.argtypes = [_PTR, _I64, _I64, _PTR, _PTR, ctypes.c_int]
    built.llama_layer.argtypes = (ctypes.POINTER(LlamaLayer), ctypes.POINTER(LlamaStep), *[_PTR] * 6, ctypes.c_int)
    built.llama_layers.restype = ctypes.c_int
    built.llama_layers.argtypes = (ctypes.POINTER(LlamaLayer), _I64, ctypes.POINTER(LlamaStep), *[_PTR] * 6, _I64,
                                   ctypes.c_int)
    log.info("C kernels built in %.2f s (int4 matmul: %s)", time.perf_counter() - started,
             _ACTIVATIONS.get(built.int4_matmul_ready(), "no, this CPU lacks AVX2 + FMA"))
    return built


def _build(compiler: str) -> ctypes.CDLL:
    with tempfile.TemporaryDirectory(prefix="llm-native-") as folder:
        target = Path(folder) / "kernels.so"
        done = subprocess.run([compiler, *FLAGS, *map(str, SOURCES), "-o", str(target)],
                              capture_output=True, text=True, check=False, timeout=120)
        if done.returncode != 0:
            raise OSError(f"{compiler} failed: {done.stderr.strip()[-500:]}")
        return ctypes.CDLL(str(target))  # stays mapped once the file is gone


def paged_attention(query: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                    step: tuple[torch.Tensor, ...], scale: float, window: int) -> Optional[torch.Tensor]:
    """query [1, heads, tokens, dim] (any strides but a contiguous dim); k_pool [blocks, kv_heads,
    dim, block_size] and v_pool [blocks, block_size, kv_heads, dim], contiguous; step: q_starts,
    q_lens, ctx_lens (int64) and the block tables [sequences, width] (int32), as PagedStep.c_args
    makes them. Returns [tokens, heads, dim], or None where the kernels are missing or do not take
    these tensors."""
    built = library()
    if built is None or not _fits(query, k_pool, v_pool):
        return None
    _, heads, tokens, dim = query.shape
    q_starts, q_lens, ctx_lens, tables = step
    out = torch.empty((tokens, heads, dim))
    blocks, block_size, kv_heads, _ = v_pool.shape
    status = built.paged_attention(query.data_ptr(), query.stride(2), query.stride(1), k_pool.data_ptr(),
                                   v_pool.data_ptr(), out.data_ptr(), q_starts.data_ptr(), q_lens.data_ptr(),
                                   ctx_lens.data_ptr(), tables.data_ptr(), tables.shape[1], tables.shape[0], heads,
                                   kv_heads, dim, block_size, window, scale, torch.get_num_threads())
    if status == -2:
        raise MemoryError("paged attention: out of memory for its scores")
    return out if status == 0 else None


def int4_ready() -> bool:
    """Whether `int4_matmul` runs here (built, and the CPU has AVX512-BF16 or AVX2 + FMA)."""
    return int4_activations() is not None


def int4_activations() -> Optional[str]:
    """What int4_matmul.c rounds x to here: "bf16" (AVX512-BF16), "int8" (AVX2: int4.py's
    `int8_blocks`), or None where it does not run."""
    built = library()
    return None if built is None else _ACTIVATIONS.get(built.int4_matmul_ready())


@dataclass(frozen=True)
class Int4Weights:
    """What int4_matmul.c reads of one layer: the addresses of int4.py's packed buffers (kept
    alive by the layer, which never moves them) and the layer's sizes."""

    packed: int
    scale: int
    low: int
    width: int
    outputs: int


def int4_weights(packed: torch.Tensor, scale: torch.Tensor, low: torch.Tensor) -> Int4Weights:
    groups, blocks, pairs, channels = packed.shape  # int4.py's layout: two steps per byte
    return Int4Weights(packed.data_ptr(), scale.data_ptr(), low.data_ptr(), blocks * pairs * 2, groups * channels)


def int4_matmul(x: torch.Tensor, weights: Int4Weights) -> torch.Tensor:
    """x [rows, width] on CPU times a layer's int4 weights; returns [rows, outputs] fp32. Only
    where `int4_ready()`. A decode step makes about 200 of these calls, so this stays lean."""
    built = library()
    if built is None:
        raise RuntimeError("int4 matmul: the C kernels are not built (check int4_ready() first)")
    if x.dtype != torch.float32 or not x.is_contiguous():
        x = x.float().contiguous()
    rows = x.shape[0]
    y = torch.empty((rows, weights.outputs), dtype=torch.float32)
    if rows == 0:
        return y
    status = built.int4_matmul(x.data_ptr(), weights.packed, weights.scale, weights.low, y.data_ptr(),
                               rows, weights.width, weights.outputs, torch.get_num_threads())
    if status != 0:
        raise MemoryError("int4 matmul: out of memory") if status == -2 else ValueError(
            f"int4 matmul: x {tuple(x.shape)} does not fit weights of {weights.width} inputs")
    return y


def int8_ready() -> bool:
    """Whether `int8_matmul` runs here (built, and the CPU has AVX2 + FMA)."""
    built = library()
    return built is not None and bool(built.int8_matmul_ready())


def int8_matmul(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x [rows, width] on CPU times int8 weights packed [outputs / 16, width, 16] (int8) with fp32
    scales [outputs]; returns [rows, outputs] fp32. Only where `int8_ready()`."""
    built = library()
    if built is None:
        raise RuntimeError("int8 matmul: the C kernels are not built (check int8_ready() first)")
    if x.dtype != torch.float32 or not x.is_contiguous():
        x = x.float().contiguous()
    groups, width, channels = packed.shape
    if packed.dtype != torch.int8 or scale.dtype != torch.float32 or packed.device.type != "cpu":
        raise ValueError("dtype: int8 layers run on CPU with fp32 scales; load the model again instead")
    if x.shape[1] != width:
        raise ValueError(f"int8 matmul: x {tuple(x.shape)} does not fit weights of {width} inputs")
    y = torch.empty((x.shape[0], groups * channels), dtype=torch.float32)
    if x.shape[0] and built.int8_matmul(x.data_ptr(), packed.data_ptr(), scale.data_ptr(), y.data_ptr(),
                                        x.shape[0], width, groups * channels, torch.get_num_threads()):
        raise ValueError(f"int8 matmul: weights {tuple(packed.shape)} are not int8_matmul.c's layout")
    return y


class _Int4(ctypes.Structure):
    _fields_ = [("packed", _PTR), ("scale", _PTR), ("low", _PTR), ("width", _I64), ("outputs", _I64)]


class LlamaLayer(ctypes.Structure):
    """llama_layer.c's LlamaLayer: one decoder layer's weights and sizes."""

    _fields_ = [("qkv", _Int4), ("o", _Int4), ("gate_up", _Int4), ("down", _Int4), ("norm_in", _PTR),
                ("norm_post", _PTR), ("eps_in", ctypes.c_float), ("eps_post", ctypes.c_float),
                ("scale", ctypes.c_float), ("hidden", _I64), ("heads", _I64), ("kv_heads", _I64), ("dim", _I64),
                ("inter", _I64)]


class LlamaStep(ctypes.Structure):
    """llama_layer.c's LlamaStep: where a step's tokens go, and the paged attention's tables."""

    _fields_ = [("slots", _PTR), ("q_starts", _PTR), ("q_lens", _PTR), ("ctx_lens", _PTR), ("tables", _PTR),
                ("tokens", _I64), ("sequences", _I64), ("table_width", _I64), ("block", _I64)]


@dataclass(frozen=True)
class LlamaLayerSizes:
    hidden: int
    heads: int
    kv_heads: int
    dim: int
    inter: int
    scale: float  # the attention's


def llama_layer_args(qkv: Int4Weights, o: Int4Weights, gate_up: Int4Weights, down: Int4Weights,
                     norms: tuple[torch.Tensor, torch.Tensor], eps: tuple[float, float],
                     sizes: LlamaLayerSizes) -> Optional[LlamaLayer]:
    """A layer for `llama_layer`, or None where it does not run here. The norms' weights must
    stay where they are (the caller keeps them), as the int4 buffers do."""
    if library() is None or not _cpu_fp32(*norms) or not all(t.is_contiguous() for t in norms):
        return None
    parts = [_Int4(w.packed, w.scale, w.low, w.width, w.outputs) for w in (qkv, o, gate_up, down)]
    return LlamaLayer(*parts, norms[0].data_ptr(), norms[1].data_ptr(), eps[0], eps[1], sizes.scale, sizes.hidden,
                      sizes.heads, sizes.kv_heads, sizes.dim, sizes.inter)


def llama_step(slots: torch.Tensor, c_args: tuple[torch.Tensor, ...], block: int) -> LlamaStep:
    """A step for `llama_layer`: slots [tokens] int64 and paged_attention's c_args, which the
    caller keeps alive for the step."""
    q_starts, q_lens, ctx_lens, tables = c_args
    return LlamaStep(slots.data_ptr(), q_starts.data_ptr(), q_lens.data_ptr(), ctx_lens.data_ptr(),
                     tables.data_ptr(), slots.shape[0], tables.shape[0], tables.shape[1], block)


def llama_layer(layer: LlamaLayer, step: LlamaStep, rotary: tuple[torch.Tensor, torch.Tensor], x: torch.Tensor,
                k_pool: torch.Tensor, v_pool: torch.Tensor) -> Optional[torch.Tensor]:
    """One decoder layer of a step (llama_layer.c): x [1, tokens, hidden] fp32 in, the layer's
    output out; rotary: cos and sin [1, tokens, head_dim]. None where the kernels do not take
    these tensors (the caller runs the layer otherwise)."""
    return _layers(ctypes.byref(layer), 1, layer, step, rotary, x, k_pool, v_pool)


def llama_stack(layers: list[LlamaLayer]) -> Any:
    """A model's layers for `llama_layers`, in order, built once (a ctypes array)."""
    return (LlamaLayer * len(layers))(*layers)


def llama_layers(stack: Any, step: LlamaStep, rotary: tuple[torch.Tensor, torch.Tensor], x: torch.Tensor,
                 k_pools: torch.Tensor, v_pools: torch.Tensor) -> Optional[torch.Tensor]:
    """Every layer of `stack` for a step in one call, as `llama_layer` one after another; k_pools
    and v_pools: the pool's keys and values of every layer (KVPool's). None where it does not run."""
    if k_pools.shape[0] != len(stack) or v_pools.shape[0] != len(stack):
        return None
    return _layers(stack, len(stack), stack[0], step, rotary, x, k_pools, v_pools)


def _layers(layers: Any, count: int, first: LlamaLayer, step: LlamaStep, rotary: tuple[torch.Tensor, torch.Tensor],
            x: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor) -> Optional[torch.Tensor]:
    built = library()
    cos, sin = (t.float().contiguous() for t in rotary)
    stride = k_pool.stride(0) if count > 1 else 0  # floats from one layer's pool to the next
    if (built is None or not _cpu_fp32(x, k_pool, v_pool) or not all(t.is_contiguous() for t in (x, k_pool, v_pool))
            or x.shape[-1] != first.hidden or x.numel() != step.tokens * first.hidden
            or cos.shape[-2] != step.tokens or cos.shape[-1] != first.dim
            or (count > 1 and v_pool.stride(0) != stride)):
        return None
    out = torch.empty_like(x)
    status = built.llama_layers(layers, count, ctypes.byref(step), cos.data_ptr(), sin.data_ptr(), x.data_ptr(),
                                out.data_ptr(), k_pool.data_ptr(), v_pool.data_ptr(), stride, torch.get_num_threads())
    if status == -2:
        raise MemoryError("llama layer: out of memory")
    return out if status == 0 else None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> Optional[torch.Tensor]:
    """LlamaRMSNorm over x's last dimension, as llama_layer.c computes it; None where it cannot
    (not built, not fp32 on CPU)."""
    built = library()
    if built is None or not _cpu_fp32(x, weight) or not weight.is_contiguous():
        return None
    x = x.contiguous()
    y = torch.empty_like(x)
    built.rms_norm_rows(x.data_ptr(), weight.data_ptr(), y.data_ptr(), x.numel() // x.shape[-1], x.shape[-1], eps)
    return y


def silu(x: torch.Tensor) -> Optional[torch.Tensor]:
    """SiLU as llama_layer.c computes it; None where it cannot."""
    built = library()
    if built is None or not _cpu_fp32(x) or x.numel() == 0:
        return None
    x = x.contiguous()
    y = torch.empty_like(x)
    built.silu_rows(x.data_ptr(), y.data_ptr(), 1, x.numel(), x.numel())
    return y


def greedy(logits: torch.Tensor) -> Optional[tuple[list[int], list[float]]]:
    """Each row's argmax and its log probability, as greedy.c computes them; None where it
    cannot (not built, not AVX2, not fp32 on CPU, or a row with a NaN or an infinite maximum)."""
    built = library()
    if built is None or not built.greedy_ready() or not _cpu_fp32(logits) or logits.dim() != 2:
        return None
    logits = logits.contiguous()
    rows, vocab = logits.shape
    tokens = torch.empty(rows, dtype=torch.int64)
    logprobs = torch.empty(rows, dtype=torch.float32)
    if built.greedy_rows(logits.data_ptr(), rows, vocab, tokens.data_ptr(), logprobs.data_ptr(),
                         torch.get_num_threads()):
        return None
    return tokens.tolist(), logprobs.tolist()


def _cpu_fp32(*tensors: torch.Tensor) -> bool:
    return all(t.dtype == torch.float32 and t.device.type == "cpu" for t in tensors)


def _fits(query: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor) -> bool:
    tensors = (query, k_pool, v_pool)
    return (_cpu_fp32(*tensors) and all(t.stride(-1) == 1 for t in tensors)
            and k_pool.is_contiguous() and v_pool.is_contiguous()
            and k_pool.shape == v_pool.shape[:1] + v_pool.shape[2:] + v_pool.shape[1:2])
