"""A model's CPU tensors in one file that every engine process serving the same bytes maps, so
that replicas on one machine hold one copy of the weights, not one each.

Why: each engine process builds its kernels' layout of the weights in its own memory (the
int4 and int8 blocks repacked, q, k and v joined), so two replicas of a 1B model held two
copies. Here, once the load has built that layout, its large tensors are written to a file named
by the sha256 of their bytes (in `$LLM_WEIGHTS_CACHE`, default `~/.cache/llm-stream/weights`),
and each tensor is pointed at its place in the file, mapped copy-on-write: a page stays the page
cache's, one copy for every process that maps it, unless a process writes it (then that page is
its own, and the file is unchanged). A second replica, a reload after a keep-alive unload, or the
next start finds the file by the same bytes and maps it.

- `$LLM_SHARE_WEIGHTS`: `auto` (the default) shares where `LLM_REPLICAS` says this machine runs
  more than one replica; `on` always (replicas started as processes of their own, as
  testing/fleet.py does); `off` never. One replica keeps its private copy, which huge_pages.py
  moves onto 2 MB pages: a file's pages stay 4 KB on most kernels (MADV_COLLAPSE refuses them
  here).
- The bytes are the same, so every number is (tested: greedy tokens and logprobs with and
  without). The kernels read file pages about as fast as anonymous huge pages on this project's
  Zen 2 machine (one row of a 1B model's gate and up: 36 to 38 GB/s either way; the engine's one
  stream on the 1B and Gemma 3 270M within the run's noise).
- The file is written beside its final name and linked into place: two processes that write it
  at once both end up mapping the one that got there first. A folder that cannot be written, or
  a full disk, leaves the tensors where they are (logged): the service runs, unshared.
- The C structs that hold the tensors' addresses are rebuilt by the caller (loader.py: the plan
  again, then the private copies' memory given back); the engine's own layers point again here
  (`repoint`).
- Files stay for the next start, as the quantized and compiled caches do; delete the folder to
  reclaim the disk.
"""
import hashlib
import logging
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from torch import nn

from contract import settings

from ..cache_folder import cache_folder
from . import huge_pages

log = logging.getLogger(__name__)

FORMAT = 1  # the file's layout: each storage's bytes at its offset, in order
SMALLEST = 1 << 16  # tensors under 64 KiB stay where they are (norms, biases: little to share)
ALIGN = 1 << 12  # each storage starts on a page of its own


@dataclass(frozen=True)
class Placed:
    """A storage's bytes, and where the file holds them."""

    storage: torch.UntypedStorage
    offset: int

    @property
    def nbytes(self) -> int:
        return self.storage.nbytes()

    def bytes(self) -> np.ndarray:
        return _as_uint8(self.storage).numpy()


def root() -> Optional[Path]:
    """The folder ($LLM_WEIGHTS_CACHE) where the weights are shared, else None: $LLM_SHARE_WEIGHTS
    is off, or auto with one replica on this machine (nobody to share with, and the private copy
    stays on huge pages, which file pages cannot have on most kernels), or the folder cannot be
    written."""
    share = settings.read("LLM_SHARE_WEIGHTS")
    if share == "off" or (share == "auto" and settings.read("LLM_REPLICAS") <= 1):
        return None
    return cache_folder("LLM_WEIGHTS_CACHE", "weights")


def share(model: nn.Module, folder: Optional[Path]) -> Optional[Path]:
    """Point the model's large CPU tensors at their copy in `folder`'s file of their bytes (written
    first where it is not there yet); returns the file, or None where nothing was shared."""
    if folder is None:
        return None
    started = time.perf_counter()
    placed = _layout(model)
    if not placed:
        return None
    path = folder / f"{_digest(placed)}.weights"
    try:
        found = path.exists()
        if not found:
            _write(path, placed)
    except OSError as exc:
        log.warning("weights not shared: %s could not be written (%s); this process keeps its own copy", path, exc)
        return None
    mapped = np.memmap(path, dtype=np.uint8, mode="c")
    if mapped.nbytes != placed[-1].offset + placed[-1].nbytes:  # cut by something else than this code
        log.warning("weights not shared: %s holds %d bytes, not the %d its name says", path, mapped.nbytes,
                    placed[-1].offset + placed[-1].nbytes)
        return None
    _point(model, placed, mapped)
    log.info("weights shared: %d MB mapped from %s (%s) in %.2f s", mapped.nbytes >> 20, path,
             "found" if found else "written", time.perf_counter() - started)
    return path


def _layout(model: nn.Module) -> list[Placed]:
    """The model's CPU storages of SMALLEST or more, each at its page-aligned offset in the file."""
    placed, offset = [], 0
    for storage in (s for s in huge_pages.cpu_storages(model) if s.nbytes() >= SMALLEST):
        placed.append(Placed(storage, offset))
        offset += -(-storage.nbytes() // ALIGN) * ALIGN
    return placed


def _digest(placed: list[Placed]) -> str:
    """sha256 of the layout and of each storage's bytes (hashed on every core: hashlib lets go of
    the GIL)."""
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        parts = list(pool.map(lambda p: hashlib.sha256(p.bytes()).digest(), placed))
    digest = hashlib.sha256(f"format {FORMAT}; ".encode())
    for p, part in zip(placed, parts, strict=True):
        digest.update(f"{p.offset} {p.nbytes} ".encode() + part)
    return digest.hexdigest()[:40]


def _write(path: Path, placed: list[Placed]) -> None:
    """The file, whole: written beside `path`, then linked into place unless another process's
    copy got there first (the same bytes: that one is kept)."""
    fd, partial = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".partial")
    try:
        with os.fdopen(fd, "wb") as out:
            for p in placed:
                out.seek(p.offset)
                p.bytes().tofile(out)
            out.truncate(placed[-1].offset + placed[-1].nbytes)
        try:
            os.link(partial, path)
        except FileExistsError:
            pass
    finally:
        os.unlink(partial)


def _point(model: nn.Module, placed: list[Placed], mapped: np.ndarray) -> None:
    """Every tensor whose storage is placed now views the file's copy, at the same offsets."""
    copies = {p.storage.data_ptr(): _as_uint8(torch.from_numpy(mapped[p.offset:p.offset + p.nbytes])).untyped_storage()
              for p in placed}
    for tensor in [*model.parameters(), *model.buffers()]:
        copy = copies.get(tensor.untyped_storage().data_ptr())
        if copy is not None:
            with torch.no_grad():
                tensor.set_(copy, tensor.storage_offset(), tensor.size(), tensor.stride())
    for module in model.modules():
        repoint = getattr(module, "repoint", None)
        if callable(repoint):
            repoint()


def _as_uint8(source: "torch.UntypedStorage | torch.Tensor") -> torch.Tensor:
    """A storage's bytes as a flat uint8 tensor (no copy)."""
    storage = source.untyped_storage() if isinstance(source, torch.Tensor) else source
    return torch.empty(0, dtype=torch.uint8).set_(storage, 0, (storage.nbytes(),), (1,))
