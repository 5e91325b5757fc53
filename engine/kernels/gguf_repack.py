"""gguf_repack.c's Python side: a GGUF file's Q4_K and Q6_K blocks written, in one pass, into the
buffers the int4 and int8 products read (Int4Linear and Int8Linear, int4.py), so that a load makes
no Python pass over every weight. The buffers are those gguf_native.keep makes of k_quants.split:
tests/unit/test_gguf_repack.py compares them on every kernel path.
"""
from typing import Optional

import numpy as np
import torch

from .native import DENSE_CHANNELS, INT4_CHANNELS, library


def repack(kind: str, blocks: np.ndarray, order: Optional[np.ndarray], rows: int, width: int,
           own_scales: bool = False) -> Optional[tuple[torch.Tensor, ...]]:
    """A GGUF tensor's raw blocks [rows, bytes per row] (`kind`: "Q4_K" or "Q6_K"), its rows taken in
    `order` (int64; None: as they are), as the buffers Int4Linear (packed, scale, low: Q4_K) or
    Int8Linear (steps, scales: Q6_K) hold: gguf_repack.c, in one pass. Their scales (and a Q4_K's
    lows) are fp32, or with `own_scales` the file's own: native.int4k_matmul's (fp16 d and -dmin
    per 256, u8 sc and m per 32) and native.int8k_matmul's (fp16 d per 256, int8 sc per 16, a third
    buffer). None where the kernels are not built or the shape does not fit (rows a multiple of
    16, width of 256)."""
    built = library()
    if built is None or rows % INT4_CHANNELS or width % 256 or blocks.shape[0] != rows:
        return None
    blocks = np.ascontiguousarray(blocks)
    order = None if order is None else np.ascontiguousarray(order, dtype=np.int64)
    where = None if order is None else order.ctypes.data
    groups = rows // INT4_CHANNELS
    if kind == "Q4_K" and own_scales:
        packed = torch.empty((groups, width // 32, 16, INT4_CHANNELS), dtype=torch.uint8)
        super_ = torch.empty((groups, width // 256, 2, INT4_CHANNELS), dtype=torch.float16)
        sub = torch.empty((groups, width // 32, 2, INT4_CHANNELS), dtype=torch.uint8)
        status = built.repack_q4_k_own(blocks.ctypes.data, where, rows, width, packed.data_ptr(), super_.data_ptr(),
                                       sub.data_ptr(), torch.get_num_threads())
        return None if status else (packed, super_, sub)
    if kind == "Q4_K":
        packed = torch.empty((groups, width // 32, 16, INT4_CHANNELS), dtype=torch.uint8)
        scale, low = (torch.empty((groups, width // 32, INT4_CHANNELS), dtype=torch.float32) for _ in range(2))
        status = built.repack_q4_k(blocks.ctypes.data, where, rows, width, packed.data_ptr(), scale.data_ptr(),
                                   low.data_ptr(), torch.get_num_threads())
        return None if status else (packed, scale, low)
    if kind == "Q6_K" and own_scales:
        steps = torch.empty((groups, width, DENSE_CHANNELS), dtype=torch.int8)
        super_ = torch.empty((groups, width // 256, DENSE_CHANNELS), dtype=torch.float16)
        sub8 = torch.empty((groups, width // 16, DENSE_CHANNELS), dtype=torch.int8)
        status = built.repack_q6_k_own(blocks.ctypes.data, where, rows, width, steps.data_ptr(), super_.data_ptr(),
                                       sub8.data_ptr(), torch.get_num_threads())
        return None if status else (steps, super_, sub8)
    if kind == "Q6_K":
        steps = torch.empty((groups, width, DENSE_CHANNELS), dtype=torch.int8)
        scales = torch.empty((groups, width // 16, DENSE_CHANNELS), dtype=torch.float32)
        status = built.repack_q6_k(blocks.ctypes.data, where, rows, width, steps.data_ptr(), scales.data_ptr(),
                                   torch.get_num_threads())
        return None if status else (steps, scales)
    return None
