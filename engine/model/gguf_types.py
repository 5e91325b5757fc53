"""llama.cpp's quant types, kept exactly: one table from each GGML type to the layout that
quant_matmul.c multiplies (ggml's type traits, for this engine).

Every type served here is an affine map of small integer steps per block: w = scale * step + low.
`split` returns those steps, scales and lows exactly as the file holds them:

- Q4_0, Q4_1: 4-bit steps with fp16 scale and low per 32 (int4, as `int4.quantize` keeps them);
- Q4_K: 4-bit steps with scale d * sc and low -dmin * m per 32. Those are exact fp32 products of
  an fp16 and a 6-bit integer (fp16 cannot hold them), so the layout is int4 with fp32 scales;
- Q8_0, Q5_0: int8 steps (q, and q - 16) with an fp16 scale per 32 (Q8_0's layout);
- Q5_1, Q5_K, Q6_K: int8 steps with fp32 scale (and low) per 16 inputs: Q6_K's own d * sc per 16,
  the others' per-32 pairs repeated.

The steps of every type but Q8_0 (whose steps are its bytes) are unpacked here in integers
(`_unpacked`), as the `gguf` package's dequantization unpacks them before it scales them; a type
without that path would take the dequantization itself, of the same blocks with their scales set
to one and their lows to zero.
The package's float path took 7.4 s of a 1.17B Q4_K_M model's 9.3 s load (its floats, and their
conversion back to integers), the integers here 0.5 s; tests/unit/test_gguf_types.py checks,
for every type, that both give the same steps.
"""
import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
from gguf import GGMLQuantizationType as T
from gguf import quants
from gguf.quants import Q4_K

_ONE = np.frombuffer(np.float16(1).tobytes(), np.uint8)  # fp16 1.0's two bytes
_ZERO = np.zeros(2, np.uint8)
_K_UNIT = np.array([1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1], np.uint8)  # Q4_K/Q5_K: every sc 1, every m 0


class Layout(enum.Enum):
    INT4 = "int4"  # 4-bit steps, fp16 scale and low per 32
    INT4_F32 = "int4_f32"  # 4-bit steps, fp32 scale and low per 32
    Q8_0 = "q8_0"  # int8 steps, fp16 scale per 32
    INT8_SUB = "int8_sub"  # int8 steps, fp32 scale and low (or none) per 16


@dataclass(frozen=True)
class Exact:
    """One tensor's weights as the file holds them: w[o, i] = scale[o, i // sub] * steps[o, i] +
    low[o, i // sub] (no low: 0)."""

    layout: Layout
    steps: np.ndarray  # [outputs, width], int8 (uint8 0..15 for int4)
    scale: np.ndarray  # [outputs, width // sub]: fp16 or fp32, as `layout` says
    low: Optional[np.ndarray]
    sub: int


@dataclass(frozen=True)
class Fields:
    """Where a block keeps its scale fields (byte ranges) and how the type reads its scales."""

    block: int  # weights per block
    size: int  # bytes per block
    units: tuple[tuple[int, np.ndarray], ...]  # (byte offset, bytes) that make every scale one, every low zero
    layout: Layout
    scales: Callable[[np.ndarray], tuple[np.ndarray, Optional[np.ndarray]]]  # blocks -> per-sub scale, low
    offset: int  # subtracted from the unit dequantization to give the steps (Q4_0: -8)
    sub: int


def _f16(blocks: np.ndarray, at: int) -> np.ndarray:
    return blocks[:, at:at + 2].copy().view(np.float16)[:, 0]


def _d_m(d_at: int, m_at: Optional[int]) -> Callable[[np.ndarray], tuple[np.ndarray, Optional[np.ndarray]]]:
    """Legacy blocks: one fp16 scale (and fp16 low) per block of 32."""
    def read(blocks: np.ndarray) -> tuple[np.ndarray, Optional[np.ndarray]]:
        return _f16(blocks, d_at)[:, None], None if m_at is None else _f16(blocks, m_at)[:, None]
    return read


def _q4_0(blocks: np.ndarray) -> tuple[np.ndarray, Optional[np.ndarray]]:
    d = _f16(blocks, 0)
    return d[:, None], (d * np.float16(-8))[:, None]  # d (q - 8) = d q + (-8 d), exact in fp16


def _k_scales(blocks: np.ndarray) -> tuple[np.ndarray, Optional[np.ndarray]]:
    """Q4_K and Q5_K: d sc and -(dmin m) per 32, in fp32 as the package computes them; repeated
    per 16 for int8's sub-blocks where the caller asks."""
    d, dmin = _f16(blocks, 0).astype(np.float32), _f16(blocks, 2).astype(np.float32)
    sc, m = Q4_K.get_scale_min(blocks[:, 4:16])
    return d[:, None] * sc.astype(np.float32), -(dmin[:, None] * m.astype(np.float32))


def _q6_k_scales(blocks: np.ndarray) -> tuple[np.ndarray, Optional[np.ndarray]]:
    d = _f16(blocks, 208).astype(np.float32)
    return d[:, None] * blocks[:, 192:208].view(np.int8).astype(np.float32), None


TYPES: dict[T, Fields] = {
    T.Q4_0: Fields(32, 18, ((0, _ONE),), Layout.INT4, _q4_0, -8, 32),
    T.Q4_1: Fields(32, 20, ((0, _ONE), (2, _ZERO)), Layout.INT4, _d_m(0, 2), 0, 32),
    T.Q4_K: Fields(256, 144, ((0, _ONE), (2, _ZERO), (4, _K_UNIT)), Layout.INT4_F32, _k_scales, 0, 32),
    T.Q8_0: Fields(32, 34, ((0, _ONE),), Layout.Q8_0, _d_m(0, None), 0, 32),
    T.Q5_0: Fields(32, 22, ((0, _ONE),), Layout.Q8_0, _d_m(0, None), 0, 32),
    T.Q5_1: Fields(32, 24, ((0, _ONE), (2, _ZERO)), Layout.INT8_SUB, _d_m(0, 2), 0, 32),
    T.Q5_K: Fields(256, 176, ((0, _ONE), (2, _ZERO), (4, _K_UNIT)), Layout.INT8_SUB, _k_scales, 0, 32),
    T.Q6_K: Fields(256, 210, ((208, _ONE), (192, np.ones(16, np.uint8))), Layout.INT8_SUB, _q6_k_scales, 0, 16),
}
SERVED = tuple(t.name for t in TYPES)


def _nibbles(packed: np.ndarray, run: int) -> np.ndarray:
    """Runs of `run` bytes: each run's low nibbles, then its high ones (how every type here packs)."""
    n = packed.shape[0]
    runs = packed.reshape(n, -1, run)
    out = np.empty((n, runs.shape[1], 2, run), np.uint8)
    np.bitwise_and(runs, np.uint8(0x0F), out=out[:, :, 0])
    np.right_shift(runs, np.uint8(4), out=out[:, :, 1])
    return out.reshape(n, -1)


def _unpacked(qtype: T, blocks: np.ndarray) -> Optional[np.ndarray]:
    """The blocks' steps [blocks, weights per block] unpacked in integers, where this type has
    that path: 0..15 (Q4_0, Q4_1, Q4_K), 0..31 (Q5_1, Q5_K), -16..15 (Q5_0), -32..31 (Q6_K); None
    for the others (Q8_0's steps are its bytes)."""
    n = blocks.shape[0]
    if qtype in (T.Q4_0, T.Q4_1):
        return _nibbles(blocks[:, TYPES[qtype].size - 16:], 16)
    if qtype in (T.Q5_0, T.Q5_1):  # a 32-bit word of fifth bits, then the nibbles, end the block
        at = TYPES[qtype].size - 20
        fifth = (blocks[:, at:at + 4].copy().view("<u4") >> np.arange(32, dtype=np.uint32)) & np.uint32(1)
        steps = _nibbles(blocks[:, at + 4:], 16) | (fifth.astype(np.uint8) << np.uint8(4))
        return steps.view(np.int8) - np.int8(16) if qtype is T.Q5_0 else steps
    if qtype is T.Q4_K:
        return _nibbles(blocks[:, 16:144], 32)
    if qtype is T.Q5_K:
        high = (blocks[:, 16:48].reshape(n, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & np.uint8(1)
        return _nibbles(blocks[:, 48:176], 32) | (high.reshape(n, -1) << np.uint8(4))
    if qtype is T.Q6_K:
        low = _nibbles(blocks[:, :128], 64)
        shifts = np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
        high = ((blocks[:, 128:192].reshape(n, -1, 1, 32) >> shifts) & np.uint8(3)).reshape(n, -1)
        return (low | (high << np.uint8(4))).view(np.int8) - np.int8(32)
    return None


def split(data: np.ndarray, qtype: T, width: int) -> Exact:
    """data: a 2-D tensor's raw blocks [outputs, bytes per row] (GGUFReader's `.data`)."""
    fields = TYPES[qtype]
    outputs = data.shape[0]
    blocks = np.ascontiguousarray(data).reshape(-1, fields.size)
    if qtype is T.Q8_0:  # its steps are its bytes: a view of them, copied below
        steps = blocks[:, 2:].view(np.int8).reshape(outputs, width)
    elif (unpacked := _unpacked(qtype, blocks)) is not None:  # a new array: the astype below copies nothing
        steps = unpacked.reshape(outputs, width)
    else:
        unit = blocks.copy()
        for at, value in fields.units:
            unit[:, at:at + len(value)] = value
        # the package's blocks function over all blocks at once (its `dequantize` goes a few rows a call)
        steps = getattr(quants, qtype.name).dequantize_blocks(unit).reshape(outputs, width) - fields.offset
    scale, low = fields.scales(blocks)
    scale = scale.reshape(outputs, -1)
    low = None if low is None else low.reshape(outputs, -1)
    sub = fields.sub
    if fields.layout is Layout.INT8_SUB:  # fp32 scales and lows per 16 (Q5_1's fp16 ones are exact in fp32)
        scale, low = scale.astype(np.float32), None if low is None else low.astype(np.float32)
        if sub == 32:
            scale, low, sub = np.repeat(scale, 2, axis=1), None if low is None else np.repeat(low, 2, axis=1), 16
    dtype = np.uint8 if fields.layout in (Layout.INT4, Layout.INT4_F32) else np.int8
    # Q8_0's steps are still the file's bytes where its rows are one block each (a view): copied
    # then, and only then (the reshape of rows of several blocks copied them already, and a second
    # copy of Gemma 3's 167 MB embedding was its load's time for nothing)
    return Exact(fields.layout, steps.astype(dtype, copy=np.may_share_memory(steps, data)), scale, low, sub)


def weights(exact: Exact) -> torch.Tensor:
    """The fp32 weights [outputs, width] that `exact` stands for (tests compare them with the
    package's dequantization)."""
    low = None if exact.low is None else torch.from_numpy(exact.low)
    return affine(torch.from_numpy(exact.steps), torch.from_numpy(exact.scale), low, exact.sub)


def affine(steps: torch.Tensor, scale: torch.Tensor, low: Optional[torch.Tensor], sub: int) -> torch.Tensor:
    """Rows [..., width] of weights from their steps [..., width] and per-`sub` scales and lows
    [..., width // sub]: scale * step + low in fp32, each value on its own (an embedding's looked-up
    rows are the whole table's bit for bit)."""
    values = steps.float().view(*steps.shape[:-1], -1, sub) * scale.float()[..., None]
    if low is not None:
        values += low.float()[..., None]
    return values.view(steps.shape)
