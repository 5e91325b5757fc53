"""The C kernels' Python side: each wraps one function of kernels.h (bound by build.py) for
torch tensors, and returns None where the tensors do not fit the kernel (a dtype, a device, a
shape), so the caller runs PyTorch's op for that call. table.py decides, once per setup, which
operations run in C here at all.
"""
from dataclasses import dataclass
from typing import Any, Optional

import torch

from . import build
from .table import Op, choose

INT4_CHANNELS = 16  # quant_matmul.c's outputs per group
DENSE_CHANNELS = 16  # outputs per group of dense_matmul.c (fp32, bf16 weights) and of quant_matmul.c's int8
# which product reads a layer's weights (kernels.h's WEIGHT_*)
WEIGHT_INT4, WEIGHT_INT4_F32, WEIGHT_INT8, WEIGHT_INT8_SUB, WEIGHT_INT4_K, WEIGHT_INT8_SUB_K = (
    build.CONSTANTS[f"WEIGHT_{kind}"] for kind in ("INT4", "INT4_F32", "INT8", "INT8_SUB", "INT4_K", "INT8_SUB_K"))


def library() -> Any:
    """The compiled kernels (build.py), or None."""
    return build.library()


def paged_attention(query: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                    step: tuple[torch.Tensor, ...], scale: float, window: int,
                    softcap: float = 0.0) -> Optional[torch.Tensor]:
    """query [1, heads, tokens, dim] (any strides but a contiguous dim); k_pool [blocks, kv_heads,
    dim, block_size] and v_pool [blocks, block_size, kv_heads, dim], contiguous, fp32 or fp16; step: q_starts,
    q_lens, ctx_lens (int64) and the block tables [sequences, width] (int32), as PagedStep.c_args
    makes them. softcap: scores become softcap * tanh(score / softcap) before the softmax (0:
    none). Returns [tokens, heads, dim], or None where the kernels are missing or do not take
    these tensors."""
    built = library()
    half = k_pool.dtype == torch.float16
    op = Op.PAGED_ATTENTION_FP16 if half else Op.PAGED_ATTENTION
    if built is None or not choose(op, "fp32", query.device.type).c or not _fits(query, k_pool, v_pool):
        return None
    _, heads, tokens, dim = query.shape
    q_starts, q_lens, ctx_lens, tables = step
    out = torch.empty((tokens, heads, dim))
    blocks, block_size, kv_heads, _ = v_pool.shape
    attend = built.paged_attention_f16 if half else built.paged_attention
    status = attend(query.data_ptr(), query.stride(2), query.stride(1), k_pool.data_ptr(), v_pool.data_ptr(),
                    out.data_ptr(), q_starts.data_ptr(), q_lens.data_ptr(), ctx_lens.data_ptr(), tables.data_ptr(),
                    tables.shape[1], tables.shape[0], heads, kv_heads, dim, block_size, window, scale, softcap,
                    torch.get_num_threads())
    if status == -2:
        raise MemoryError("paged attention: out of memory for its scores")
    return out if status == 0 else None


def kv_half_ready() -> bool:
    """Whether the C attention (and so the whole C layers) read an fp16 KV pool here (built, with F16C)."""
    return choose(Op.PAGED_ATTENTION_FP16).c


def int4_ready() -> bool:
    """Whether `int4_matmul` runs here (built: any CPU the compiler builds for)."""
    return choose(Op.INT4_MATMUL, "int4").c


def own_k_scales() -> bool:
    """Whether a Q4_K's and a Q6_K's products read their scales as the file holds them
    (`int4k_matmul`, 0.58 bytes a weight; `int8k_matmul`, 1.07) rather than as fp32 (`int4f_matmul`,
    0.75; `int8s_matmul`, 1.25): where they run on AVX-512, whose products at one row wait for
    memory, so that the fewer bytes go faster (a 1-row product on a 2-core Zen 5 took the time of
    its bytes with either layout). On AVX2 the unpacking costs about what the reading saves. The
    values, and so the bits, are the same either way."""
    built = library()
    return built is not None and int(built.int4_matmul_ready()) == 3


def int4_activations() -> Optional[str]:
    """What quant_matmul.c rounds x to: "int16" (int4.py's `int16_blocks`) on every path, or None
    where it does not run."""
    return "int16" if int4_ready() else None


@dataclass(frozen=True)
class Weights:
    """What quant_matmul.c reads of one layer: the addresses of its packed buffers (kept alive by
    the layer, which never moves them), the layer's sizes, and which product reads them
    (WEIGHT_*: int4.py's int4 layers, and the int8 ones of Int8Linear)."""

    packed: int
    scale: int
    low: int
    width: int
    outputs: int
    kind: int = WEIGHT_INT4


def int4_weights(packed: torch.Tensor, scale: torch.Tensor, low: torch.Tensor) -> Weights:
    groups, blocks, pairs, channels = packed.shape  # int4.py's layout: two steps per byte
    kind = WEIGHT_INT4_K if low.dtype == torch.uint8 else WEIGHT_INT4_F32 if scale.dtype == torch.float32 else WEIGHT_INT4
    return Weights(packed.data_ptr(), scale.data_ptr(), low.data_ptr(), blocks * pairs * 2, groups * channels, kind)


def int8_weights(packed: torch.Tensor, scale: torch.Tensor, low: Optional[torch.Tensor]) -> Weights:
    """An int8 layer's (packed [outputs / 16, width, 16]): fp16 scales per 32 (Q8_0's), or fp32
    scales and lows (or none) per 16."""
    groups, width, channels = packed.shape
    kind = (WEIGHT_INT8_SUB_K if low is not None and low.dtype == torch.int8
            else WEIGHT_INT8_SUB if scale.dtype == torch.float32 else WEIGHT_INT8)
    return Weights(packed.data_ptr(), scale.data_ptr(), 0 if low is None else low.data_ptr(), width,
                   groups * channels, kind)


def int4_matmul(x: torch.Tensor, weights: Weights) -> torch.Tensor:
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
    """Whether `int8_matmul` runs here (built: any CPU the compiler builds for)."""
    return choose(Op.INT8_MATMUL, "int8").c


def int8_matmul(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x [rows, width] on CPU times int8 weights packed [outputs / 16, width, 16] (int8) with fp16
    scales per block of 32 inputs [outputs / 16, blocks, 16] (Q8_0's); returns [rows, outputs] fp32.
    Only where `int8_ready()`."""
    if packed.dtype != torch.int8 or scale.dtype != torch.float16 or packed.device.type != "cpu":
        raise ValueError("dtype: int8 layers run on CPU with fp16 scales; load the model again instead")
    return _dense("int8_matmul", x, packed, scale.data_ptr())


def int4f_matmul(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
    """`int4_matmul` for weights whose scales and lows are fp32 ([outputs / 16, blocks, 16]: Q4_K's
    per-32 d sc and dmin m); the same packed steps. Only where `int4_ready()`."""
    groups, blocks, pairs, channels = packed.shape
    return _quant("int4f_matmul", x, packed, (scale, low), blocks * pairs * 2, groups * channels)


def int4k_matmul(x: torch.Tensor, packed: torch.Tensor, super_: torch.Tensor, sub: torch.Tensor) -> torch.Tensor:
    """`int4f_matmul` for a Q4_K's scales as the file holds them: `super_` fp16 [outputs / 16, width
    / 256, 2, 16] (d, -dmin), `sub` u8 [outputs / 16, width / 32, 2, 16] (sc, m). Only where
    `int4_ready()`."""
    groups, blocks, pairs, channels = packed.shape
    return _quant("int4k_matmul", x, packed, (super_, sub), blocks * pairs * 2, groups * channels, fp32=False)


def int8k_matmul(x: torch.Tensor, packed: torch.Tensor, super_: torch.Tensor, sub: torch.Tensor) -> torch.Tensor:
    """`int8s_matmul` without lows for a Q6_K's scales as the file holds them: `super_` fp16 [outputs
    / 16, width / 256, 16] (d), `sub` int8 [outputs / 16, width / 16, 16] (sc). Only where
    `int8_ready()`."""
    groups, width, channels = packed.shape
    return _quant("int8k_matmul", x, packed, (super_, sub), width, groups * channels, fp32=False)


def int8s_matmul(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor,
                 low: Optional[torch.Tensor]) -> torch.Tensor:
    """x times int8 steps packed [outputs / 16, width, 16] with an fp32 scale and low (or None) per
    16 inputs [outputs / 16, width / 16, 16] (Q5_1, Q5_K, Q6_K). Only where `int8_ready()`."""
    groups, width, channels = packed.shape
    return _quant("int8s_matmul", x, packed, (scale, low), width, groups * channels)


def _quant(function: str, x: torch.Tensor, packed: torch.Tensor, scales: tuple[Optional[torch.Tensor], ...],
           width: int, outputs: int, fp32: bool = True) -> torch.Tensor:
    """One of quant_matmul.c's products with fp32 scales (None: a NULL pointer), or with a K-quant's
    own (`fp32` False: int4k, int8k)."""
    built = library()
    if built is None:
        raise RuntimeError(f"{function}: the C kernels are not built (check int4_ready() first)")
    if any(t is not None and ((fp32 and t.dtype != torch.float32) or not t.is_contiguous()) for t in scales):
        raise ValueError(f"{function}: scales must be contiguous" + (" fp32" if fp32 else ""))
    if x.dtype != torch.float32 or not x.is_contiguous():
        x = x.float().contiguous()
    if x.shape[1] != width:
        raise ValueError(f"{function}: x {tuple(x.shape)} does not fit weights of {width} inputs")
    y = torch.empty((x.shape[0], outputs), dtype=torch.float32)
    pointers = [t.data_ptr() if t is not None else None for t in scales]
    status = getattr(built, function)(x.data_ptr(), packed.data_ptr(), *pointers, y.data_ptr(), x.shape[0], width,
                                      outputs, torch.get_num_threads()) if x.shape[0] else 0
    if status:
        raise MemoryError(f"{function}: out of memory") if status == -2 else ValueError(
            f"{function}: weights {tuple(packed.shape)} do not fit its layout")
    return y


def fp32_ready() -> bool:
    """Whether `fp32_matmul` runs here (built, and the CPU has AVX2 + FMA)."""
    return choose(Op.FP32_MATMUL, "fp32").c


def fp32_matmul(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    """x [rows, width] on CPU times fp32 weights packed [outputs / 16, width, 16]; returns [rows,
    outputs] fp32. Only where `fp32_ready()`."""
    return _dense("fp32_matmul", x, packed)


def bf16_matmul(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    """fp32_matmul for weights that are bf16 values, packed as bf16 [outputs / 16, width, 16]: the
    same numbers from half the bytes."""
    return _dense("bf16_matmul", x, packed)


def _dense(function: str, x: torch.Tensor, packed: torch.Tensor, *between: int) -> torch.Tensor:
    """One of dense_matmul.c's products: x, the packed weights, `between` (an int8 layer's scales), y."""
    built = library()
    if built is None:
        raise RuntimeError(f"{function}: the C kernels are not built (check its *_ready() first)")
    if x.dtype != torch.float32 or not x.is_contiguous():
        x = x.float().contiguous()
    groups, width, channels = packed.shape
    if x.shape[1] != width:
        raise ValueError(f"{function}: x {tuple(x.shape)} does not fit weights of {width} inputs")
    y = torch.empty((x.shape[0], groups * channels), dtype=torch.float32)
    if x.shape[0] and getattr(built, function)(x.data_ptr(), packed.data_ptr(), *between, y.data_ptr(), x.shape[0],
                                               width, groups * channels, torch.get_num_threads()):
        raise ValueError(f"{function}: weights {tuple(packed.shape)} are not dense_matmul.c's layout")
    return y


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> Optional[torch.Tensor]:
    """LlamaRMSNorm over x's last dimension, as llama_layer.c computes it; None where it cannot
    (not built, not fp32 on CPU)."""
    built = library()
    if built is None or not cpu_fp32(x, weight) or not weight.is_contiguous():
        return None
    x = x.contiguous()
    y = torch.empty_like(x)
    built.rms_norm_rows(x.data_ptr(), weight.data_ptr(), y.data_ptr(), x.numel() // x.shape[-1], x.shape[-1], eps)
    return y


def silu(x: torch.Tensor) -> Optional[torch.Tensor]:
    """SiLU as llama_layer.c computes it; None where it cannot."""
    return _each_value(x, lambda built, n, x_at, y_at: built.silu_rows(x_at, y_at, 1, n, n))


def gelu_tanh(x: torch.Tensor) -> Optional[torch.Tensor]:
    """GELU's tanh approximation (Gemma's GeGLU) as llama_layer.c computes it; None where it cannot."""
    return _each_value(x, lambda built, n, x_at, y_at: built.gelu_tanh_rows(x_at, y_at, n))


def _each_value(x: torch.Tensor, call: Any) -> Optional[torch.Tensor]:
    """An activation of llama_layer.c over every value of x: call(library, n, x's, y's address)."""
    built = library()
    if built is None or not cpu_fp32(x) or x.numel() == 0:
        return None
    x = x.contiguous()
    y = torch.empty_like(x)
    call(built, x.numel(), x.data_ptr(), y.data_ptr())
    return y


def greedy(logits: torch.Tensor) -> Optional[tuple[list[int], list[float]]]:
    """Each row's argmax and its log probability, as greedy.c computes them; None where it
    cannot (not built, not fp32 on CPU, or a row with a NaN or an infinite maximum)."""
    built, logits = _logit_rows(logits)
    if built is None:
        return None
    rows, vocab = logits.shape
    tokens = torch.empty(rows, dtype=torch.int64)
    logprobs = torch.empty(rows, dtype=torch.float32)
    if built.greedy_rows(logits.data_ptr(), rows, vocab, tokens.data_ptr(), logprobs.data_ptr(),
                         torch.get_num_threads()):
        return None
    return tokens.tolist(), logprobs.tolist()


def log_softmax(logits: torch.Tensor) -> Optional[torch.Tensor]:
    """log_softmax over the last dimension of [rows, vocab] fp32 logits as greedy.c computes it
    (arith.h's arithmetic: the same bits on every CPU); None where it cannot (not built, not fp32
    on CPU, or a row with a NaN or an infinite maximum)."""
    built, logits = _logit_rows(logits)
    if built is None:
        return None
    out = torch.empty_like(logits)
    if built.log_softmax_rows(logits.data_ptr(), logits.shape[0], logits.shape[1], out.data_ptr(),
                              torch.get_num_threads()):
        return None
    return out


def _logit_rows(logits: torch.Tensor) -> tuple[Any, torch.Tensor]:
    """greedy.c's library and the logits as it reads them ([rows, vocab] fp32 on CPU,
    contiguous), or (None, logits) where it does not take them."""
    built = library()
    if built is None or not choose(Op.GREEDY).c or not cpu_fp32(logits) or logits.dim() != 2:
        return None, logits
    return built, logits.contiguous()


def cpu_fp32(*tensors: torch.Tensor) -> bool:
    return all(t.dtype == torch.float32 and t.device.type == "cpu" for t in tensors)


def kv_pool_fits(k_pool: torch.Tensor, v_pool: torch.Tensor) -> bool:
    """Keys and values the kernels read: both fp32 or both fp16, on CPU."""
    return (k_pool.dtype == v_pool.dtype and k_pool.dtype in (torch.float32, torch.float16)
            and k_pool.device.type == v_pool.device.type == "cpu")


def _fits(query: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor) -> bool:
    tensors = (query, k_pool, v_pool)
    return (cpu_fp32(query) and kv_pool_fits(k_pool, v_pool) and all(t.stride(-1) == 1 for t in tensors)
            and k_pool.is_contiguous() and v_pool.is_contiguous()
            and k_pool.shape == v_pool.shape[:1] + v_pool.shape[2:] + v_pool.shape[1:2])
