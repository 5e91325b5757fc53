"""Where a Hugging Face folder's weights, once quantized at load (quantize_on_load.py), are kept,
so that the next start reads blocks instead of quantizing again.

An entry is a folder named by a key: the sha256 of the folder's weight files' contents, its
config.json, the type and this format's version. A changed file is a new key, never a stale
entry. Hashing a file costs about a second per GB, so each file's hash is remembered under its
path, size, modification time and inode (`hashes.json`), and a restart hashes nothing.

An entry holds one file of every tensor's bytes end to end, each 64-byte aligned, and an index
of where each one lies, written last. The entry is written into a folder of its own and renamed
into place whole: a start that stops half way, or two replicas writing at once, never leave an
entry that looks complete. Reading maps the file (numpy.memmap): nothing is read twice.
"""
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Optional

import numpy as np

from ..cache_folder import cache_folder

log = logging.getLogger(__name__)

FORMAT = 1  # this layout's version: a change makes every older entry a miss
_ALIGN = 64
_DATA, _INDEX = "tensors.bin", "index.json"


def root() -> Optional[Path]:
    """The cache folder ($LLM_QUANT_CACHE), or None where it cannot be written (then every start
    quantizes)."""
    return cache_folder("LLM_QUANT_CACHE", "quantized")


def weight_files(folder: Path) -> list[Path]:
    """A Hugging Face folder's weight files, the ones its entries are keyed by (none: not a folder)."""
    return sorted(folder.glob("*.safetensors")) if folder.is_dir() else []


def key(source: Path, files: list[Path], kind: str, cache: Optional[Path]) -> str:
    """The entry's name for these weight files of `source` quantized as `kind`."""
    digest = hashlib.sha256(f"format {FORMAT}; {kind}".encode())
    config = source / "config.json"
    for path in sorted(files) + ([config] if config.exists() else []):
        digest.update(f"; {path.name} {_content_hash(path, cache)}".encode())
    return digest.hexdigest()[:32]


def _content_hash(path: Path, cache: Optional[Path]) -> str:
    """The file's sha256, remembered by its stat in the cache's hashes.json."""
    stat = path.stat()
    mark = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{stat.st_ino}"
    known_path = None if cache is None else cache / "hashes.json"
    known: dict[str, str] = {}
    if known_path is not None and known_path.exists():
        try:
            known = json.loads(known_path.read_text())
        except (OSError, ValueError):
            known = {}
    if mark in known:
        return known[mark]
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    known[mark] = digest.hexdigest()
    if known_path is not None:
        _write_atomically(known_path, json.dumps(known, indent=0))
    return known[mark]


def _write_atomically(path: Path, text: str) -> None:
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    partial.write_text(text)
    partial.replace(path)


@dataclass(frozen=True)
class Stored:
    """One tensor of an entry: `kind` is a GGML type's name for blocks ([rows, bytes per row]
    uint8), "F32" for values, or the class of the layer whose buffer it is (int4_cache.py)."""

    name: str
    kind: str
    data: np.ndarray


class Writer:
    """Appends tensors to a new entry; `commit` makes it visible, `discard` removes it."""

    def __init__(self, cache: Path, name: str, meta: dict[str, Any]):
        self.final = cache / name
        self.folder = cache / f"{name}.{os.getpid()}.partial"
        shutil.rmtree(self.folder, ignore_errors=True)
        self.folder.mkdir(parents=True)
        self.file: BinaryIO = open(self.folder / _DATA, "wb")
        self.index: dict[str, Any] = {"meta": meta, "tensors": {}}

    def add(self, stored: Stored) -> None:
        data = np.ascontiguousarray(stored.data)
        self.file.write(b"\0" * (-self.file.tell() % _ALIGN))
        self.index["tensors"][stored.name] = {"kind": stored.kind, "dtype": data.dtype.str,
                                              "shape": list(data.shape), "offset": self.file.tell()}
        self.file.write(data.tobytes())

    def commit(self) -> None:
        self.file.close()
        (self.folder / _INDEX).write_text(json.dumps(self.index))
        try:
            self.folder.rename(self.final)
        except OSError:  # another process put the same entry in place first
            shutil.rmtree(self.folder, ignore_errors=True)

    def discard(self) -> None:
        self.file.close()
        shutil.rmtree(self.folder, ignore_errors=True)


def entry(cache: Optional[Path], name: str) -> Optional[dict[str, Any]]:
    """The entry's index, or None where there is no complete entry of that name."""
    if cache is None or not (cache / name / _INDEX).exists():
        return None
    try:
        index: dict[str, Any] = json.loads((cache / name / _INDEX).read_text())
    except (OSError, ValueError):
        return None
    index["folder"] = str(cache / name)
    return index


def read(index: dict[str, Any]) -> Iterator[Stored]:
    """The entry's tensors, mapped from its file."""
    data = np.memmap(Path(index["folder"]) / _DATA, dtype=np.uint8, mode="r")
    for name, where in index["tensors"].items():
        dtype = np.dtype(where["dtype"])
        count = int(np.prod(where["shape"])) * dtype.itemsize
        chunk = data[where["offset"]:where["offset"] + count]
        yield Stored(name, where["kind"], chunk.view(dtype).reshape(where["shape"]))
