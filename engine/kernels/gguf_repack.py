"""gguf_repack.c's Python side: a GGUF file's Q4_K, Q6_K, Q4_0, Q4_1, Q5_0 and Q8_0 blocks written,
in one pass, into the buffers the int4 and int8 products read (Int4Linear and Int8Linear, int4.py),
so that a load makes no Python pass over every weight. The buffers are those gguf_native.keep makes
of gguf_types.split: tests/unit/test_gguf_repack.py compares them on every kernel path.
"""
from typing import Optional

import numpy as np
import torch

from .native import DENSE_CHANNELS, INT4_CHANNELS, library

BLOCK = {"Q4_K": 256, "Q6_K": 256, "Q4_0": 32, "Q4_1": 32, "Q5_0": 32, "Q8_0": 32}  # the types repacked: weights a block
INT4 = ("Q4_K", "Q4_0", "Q4_1")  # into Int4Linear's buffers; the others into Int8Linear's


def repack(kind: str, blocks: np.ndarray, order: Optional[np.ndarray], rows: int, width: int,
           own_scales: bool = False) -> Optional[tuple[torch.Tensor, ...]]:
    """A GGUF tensor's raw blocks [rows, bytes per row] (`kind`: one of BLOCK), its rows taken in
    `order` (int64; None: as they are), as the buffers Int4Linear (packed, scale, low: Q4_K, Q4_0,
    Q4_1) or Int8Linear (steps, scales: Q6_K, Q5_0, Q8_0) hold: gguf_repack.c, in one pass. A
    K-quant's scales (and a Q4_K's lows) are fp32, or with `own_scales` the file's own:
    native.int4k_matmul's (fp16 d and -dmin per 256, u8 sc and m per 32) and native.int8k_matmul's
    (fp16 d per 256, int8 sc per 16, a third buffer); the others' are fp16 per 32, the file's. None
    where the kernels are not built or the shape does not fit (rows a multiple of 16, width of the
    type's block)."""
    built = library()
    if built is None or kind not in BLOCK or rows % INT4_CHANNELS or width % BLOCK[kind] or blocks.shape[0] != rows:
        return None
    blocks = np.ascontiguousarray(blocks)
    order = None if order is None else np.ascontiguousarray(order, dtype=np.int64)
    where = None if order is None else order.ctypes.data
    function, shapes = _layout(kind, own_scales, rows // INT4_CHANNELS, width)
    buffers = tuple(torch.empty(shape, dtype=dtype) for shape, dtype in shapes)
    status = getattr(built, function)(blocks.ctypes.data, where, rows, width, *(b.data_ptr() for b in buffers),
                                      torch.get_num_threads())
    return None if status else buffers


def _layout(kind: str, own_scales: bool, groups: int, width: int) -> tuple[str, list[tuple[tuple[int, ...], torch.dtype]]]:
    """gguf_repack.c's function for the type and scales, and the (shape, dtype) of each buffer it writes."""
    steps: tuple[tuple[int, ...], torch.dtype]
    per_32 = ((groups, width // 32, INT4_CHANNELS), torch.float16)
    if kind in ("Q4_0", "Q4_1"):  # packed as Q4_K's, fp16 scale and low
        return f"repack_{kind.lower()}", [((groups, width // 32, 16, INT4_CHANNELS), torch.uint8), per_32, per_32]
    if kind in ("Q5_0", "Q8_0"):
        return f"repack_{kind.lower()}", [((groups, width, DENSE_CHANNELS), torch.int8), per_32]
    if kind == "Q4_K":
        steps = ((groups, width // 32, 16, INT4_CHANNELS), torch.uint8)
        if own_scales:  # fp16 d and -dmin per 256; u8 sc and m per 32
            return "repack_q4_k_own", [steps, ((groups, width // 256, 2, INT4_CHANNELS), torch.float16),
                                       ((groups, width // 32, 2, INT4_CHANNELS), torch.uint8)]
        return "repack_q4_k", [steps, *[((groups, width // 32, INT4_CHANNELS), torch.float32)] * 2]
    steps = ((groups, width, DENSE_CHANNELS), torch.int8)
    if own_scales:  # fp16 d per 256; int8 sc per 16
        return "repack_q6_k_own", [steps, ((groups, width // 256, DENSE_CHANNELS), torch.float16),
                                   ((groups, width // 16, DENSE_CHANNELS), torch.int8)]
    return "repack_q6_k", [steps, ((groups, width // 16, DENSE_CHANNELS), torch.float32)]
