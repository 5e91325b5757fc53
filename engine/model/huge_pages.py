"""The model's large CPU tensors moved onto 2 MB pages (transparent huge pages), in place.

Why: a decode step reads every weight from memory once. On 4 KB pages, Gemma 3 270M's output
layer (167 MB of Q8_0) spans 41,000 pages, each a TLB miss, and the CPU's own prefetchers stop
at every page's end. On 2 MB pages its products at sixteen rows took 15.1 ms instead of 16.7 (and
5.2 ms instead of 5.6 at one row) on this project's 2-core AVX-512 machine, the same bits.

`madvise(MADV_COLLAPSE)` (Linux 6.1 on) copies a range's pages into huge ones where they are:
every address stays, so the C structs that already point at the weights (llama_layer.c's) are
unchanged. It is best effort: where the kernel is older, or huge pages are off, the weights stay
on small pages, and the log says so once. Only whole 2 MB pages inside a tensor move; a tensor
under 2 MB is left alone.

The load does not wait for it (`collapse_soon`): the copy took 0.3 s of the default model's 1.6 s
load, on the start's critical path, and runs instead on a thread of the lowest CPU priority while
the model already serves (its reads meanwhile are the same values at the same addresses).
"""
import ctypes
import errno
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Optional

import torch
from torch import nn

log = logging.getLogger(__name__)

HUGE_PAGE = 2 << 20
MADV_HUGEPAGE = 14  # the range may be collapsed later too (khugepaged), where a collapse now fails
MADV_COLLAPSE = 25


def _madvise() -> Optional[Callable[[int, int, int], int]]:
    if not sys.platform.startswith("linux"):
        return None
    call = ctypes.CDLL(None, use_errno=True).madvise
    call.argtypes, call.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    return call


def covering_pages(spans: list[tuple[int, int]]) -> list[int]:
    """The 2 MB pages that hold these (start, bytes) spans, each once, by address. A small tensor
    shares its page with its neighbours on the heap; the page moves whole, whatever it holds."""
    pages: set[int] = set()
    for start, nbytes in spans:
        pages.update(range(start // HUGE_PAGE * HUGE_PAGE, start + nbytes, HUGE_PAGE))
    return sorted(pages)


def cpu_storages(model: nn.Module) -> list[torch.UntypedStorage]:
    """The memory of the model's CPU tensors, each once (tied and viewed tensors share theirs), in
    the order its parameters and buffers name them."""
    found: dict[int, torch.UntypedStorage] = {}
    for tensor in [*model.parameters(), *model.buffers()]:
        if tensor.device.type == "cpu" and tensor.numel():
            found.setdefault(tensor.untyped_storage().data_ptr(), tensor.untyped_storage())
    return list(found.values())


def collapse(model: nn.Module) -> int:
    """Move the model's CPU tensors' whole 2 MB pages onto huge pages; returns the bytes moved."""
    madvise = _madvise()
    if madvise is None:
        return 0
    started, moved, failure = time.perf_counter(), 0, None
    for page in covering_pages([(storage.data_ptr(), storage.nbytes()) for storage in cpu_storages(model)]):
        madvise(page, HUGE_PAGE, MADV_HUGEPAGE)
        if madvise(page, HUGE_PAGE, MADV_COLLAPSE) == 0:
            moved += HUGE_PAGE
        else:
            failure = failure or errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
    if failure and not moved:
        log.info("weights stay on 4 KB pages: madvise(MADV_COLLAPSE) answered %s", failure)
    elif moved:
        log.info("weights on 2 MB pages: %d MB in %.2f s%s", moved >> 20, time.perf_counter() - started,
                 f" (some ranges refused: {failure})" if failure else "")
    return moved


def collapse_soon(model: nn.Module) -> threading.Thread:
    """`collapse(model)` on a thread of its own, at the lowest CPU priority (Linux's nice 19 for
    that thread alone): started, not waited for."""
    def run() -> None:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        except (AttributeError, OSError):  # no per-thread priority here: at the process's own
            pass
        try:
            collapse(model)
        except Exception:  # noqa: BLE001 - best effort: the weights stay on 4 KB pages
            log.exception("could not move the weights onto 2 MB pages")
    thread = threading.Thread(target=run, name="llm-huge-pages", daemon=True)
    thread.start()
    return thread


def on_huge_pages(tensor: torch.Tensor) -> int:
    """How many bytes of the tensor's memory the kernel maps on huge pages (/proc/self/smaps)."""
    first, length = tensor.untyped_storage().data_ptr(), tensor.untyped_storage().nbytes()
    total, inside = 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                low, high = (int(x, 16) for x in head.split("-"))
                inside = low < first + length and first < high
            elif inside and head == "AnonHugePages:":
                total += int(line.split()[1]) * 1024
    return total
