"""The native decode attention (decode_attention.c), compiled when the engine loads.

It is compiled on the machine that runs it, with its C compiler (`$CC`, else `cc`; `-O3
-march=native`), into a temporary file. That takes under a second. Nothing is cached on disk, so
a build never meets a CPU it was not made for. Where no compiler builds it, `decode_attention`
returns None and attention.py keeps one SDPA call per row: the same guarantee (a row comes out
as it does alone), about 10% slower at 16 rows.
"""
import ctypes
import functools
import logging
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import torch

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("decode_attention.c")
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC")
_I64 = ctypes.c_int64


@functools.cache
def kernel() -> Optional[Callable[..., Any]]:
    """The compiled function, or None (logged once) where it cannot be built."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        log.warning("no C compiler: decode attention runs one SDPA call per row (slower at large batches)")
        return None
    started = time.perf_counter()
    try:
        function = _build(compiler)
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("decode attention not built (%s); one SDPA call per row instead", exc)
        return None
    function.restype = ctypes.c_int
    function.argtypes = [ctypes.c_void_p] * 5 + [_I64] * 11 + [ctypes.c_float, ctypes.c_int]
    log.info("decode attention built in %.2f s", time.perf_counter() - started)
    return function


def _build(compiler: str) -> Any:
    with tempfile.TemporaryDirectory(prefix="llm-native-") as folder:
        library = Path(folder) / "decode_attention.so"
        done = subprocess.run([compiler, *FLAGS, str(SOURCE), "-o", str(library)],
                              capture_output=True, text=True, check=False, timeout=120)
        if done.returncode != 0:
            raise OSError(f"{compiler} failed: {done.stderr.strip()[-500:]}")
        return ctypes.CDLL(str(library)).decode_attention  # stays mapped once the file is gone


def decode_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, starts: list[int],
                     scale: float) -> Optional[torch.Tensor]:
    """query [rows, heads, 1, dim], key/value [rows, kv_heads, width, dim], each row attending
    over its keys from starts[row] on; returns [rows, 1, heads, dim], or None where the kernel
    is missing or does not take these tensors."""
    function = kernel()
    if function is None or not _fits(query, key, value, starts):
        return None
    rows, heads, _, dim = query.shape
    query = query.contiguous()
    out = torch.empty((rows, 1, heads, dim), dtype=torch.float32)
    first = torch.tensor(starts, dtype=torch.int64)
    status = function(query.data_ptr(), key.data_ptr(), value.data_ptr(), out.data_ptr(), first.data_ptr(),
                      rows, heads, key.shape[1], key.shape[2], dim, *key.stride()[:3], *value.stride()[:3],
                      scale, torch.get_num_threads())
    if status == -2:
        raise MemoryError("decode attention: out of memory for its scores")
    return out if status == 0 else None


def _fits(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, starts: list[int]) -> bool:
    tensors = (query, key, value)
    return (all(t.device.type == "cpu" and t.dtype == torch.float32 and t.stride(-1) == 1 for t in tensors)
            and query.shape[2] == 1 and key.shape == value.shape and len(starts) == query.shape[0]
            and all(0 <= s < key.shape[2] for s in starts))
