"""The engine's C kernels (row_attention.c, int4_matmul.c), compiled when the engine loads.

They are compiled on the machine that runs them, with its C compiler (`$CC`, else `cc`; `-O3
-march=native`), into a temporary file. That takes under a second. Nothing is cached on disk, so
a build never meets a CPU it was not made for. Where no compiler builds them, the wrappers return
None and their callers keep PyTorch's ops: attention.py one SDPA call per row, int4.py PyTorch's
int4 kernel. Both give the same guarantee (a row comes out as it does alone), only slower.
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
from typing import Optional

import torch

log = logging.getLogger(__name__)

SOURCES = tuple(Path(__file__).with_name(name) for name in ("row_attention.c", "int4_matmul.c"))
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC")
_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
INT4_CHANNELS = 16  # int4_matmul.c's outputs per group


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
    built.row_attention.restype = built.int4_matmul.restype = built.int4_matmul_ready.restype = ctypes.c_int
    built.row_attention.argtypes = [_PTR] * 6 + [_I64] * 12 + [ctypes.c_float, ctypes.c_int]
    built.int4_matmul.argtypes = [_PTR] * 5 + [_I64] * 3 + [ctypes.c_int]
    log.info("C kernels built in %.2f s (int4 matmul: %s)", time.perf_counter() - started,
             "yes" if built.int4_matmul_ready() else "no, this CPU lacks AVX512-BF16")
    return built


def _build(compiler: str) -> ctypes.CDLL:
    with tempfile.TemporaryDirectory(prefix="llm-native-") as folder:
        target = Path(folder) / "kernels.so"
        done = subprocess.run([compiler, *FLAGS, *map(str, SOURCES), "-o", str(target)],
                              capture_output=True, text=True, check=False, timeout=120)
        if done.returncode != 0:
            raise OSError(f"{compiler} failed: {done.stderr.strip()[-500:]}")
        return ctypes.CDLL(str(target))  # stays mapped once the file is gone


def row_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, starts: list[int],
                  q_starts: list[int], scale: float) -> Optional[torch.Tensor]:
    """query [rows, heads, q, dim], key/value [rows, kv_heads, width, dim]: row r's queries from
    q_starts[r] on attend causally over its keys from starts[r] on (the last query over all of
    them); returns [rows, q, heads, dim], zero for the queries before q_starts, or None where the
    kernels are missing or do not take these tensors."""
    built = library()
    if built is None or not _fits(query, key, value, starts, q_starts):
        return None
    rows, heads, q_len, dim = query.shape
    query = query.contiguous()
    shape = (rows, q_len, heads, dim)
    out = torch.zeros(shape) if any(q_starts) else torch.empty(shape)
    first_key, first_query = torch.tensor(starts), torch.tensor(q_starts)  # alive through the call
    status = built.row_attention(query.data_ptr(), key.data_ptr(), value.data_ptr(), out.data_ptr(),
                                 first_key.data_ptr(), first_query.data_ptr(), rows, heads,
                                 key.shape[1], q_len, key.shape[2], dim, *key.stride()[:3], *value.stride()[:3],
                                 scale, torch.get_num_threads())
    if status == -2:
        raise MemoryError("row attention: out of memory for its scores")
    return out if status == 0 else None


def int4_ready() -> bool:
    """Whether `int4_matmul` runs here (built, and the CPU has AVX512-BF16)."""
    built = library()
    return built is not None and bool(built.int4_matmul_ready())


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


def _fits(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, starts: list[int], q_starts: list[int]) -> bool:
    tensors = (query, key, value)
    return (all(t.device.type == "cpu" and t.dtype == torch.float32 and t.stride(-1) == 1 for t in tensors)
            and key.shape == value.shape and len(starts) == len(q_starts) == query.shape[0])
