"""A GGUF file's tensors, straight from its header, and its config and tokenizer, read once.

The `gguf` package's reader builds a numpy view for every element of every metadata array: about
6 s for Gemma 3's 262k-token vocabulary, before transformers reads it all again for the config and
again for the tokenizer (about 25 s in all on a 2-core machine). The tensors need none of that:
`tensors` walks the header with `struct` (the vocabulary's strings are skipped by their lengths)
and maps each tensor's bytes from the file.

The config and tokenizer come from transformers' own GGUF converters (they know each
architecture), once per file: they are kept as a config.json and tokenizer files under
`~/.cache/llm-stream/gguf/`, keyed by a hash of the file's metadata (what they are made from), so
a restart reads them in a second, and copies of one file (a test's, say) share one entry. They
are derived metadata, not weights: nothing else is written.
"""
import contextlib
import copy
import functools
import hashlib
import json
import logging
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Optional

import gguf
import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from . import decoding_tokenizer

log = logging.getLogger(__name__)

_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class Tensor:
    """One tensor: its bytes as a view of the mapped file, [rows, bytes per row] for quantized
    types and [rows, width] (or [width]) for float ones, as `gguf.GGUFReader` shapes them."""

    name: str
    tensor_type: GGMLQuantizationType
    width: int  # the innermost dimension: a Linear's inputs
    data: np.ndarray


@dataclass(frozen=True)
class Header:
    metadata: dict[str, Any]  # the scalar and string fields (arrays are skipped)
    tensors: list[Tensor]
    metadata_end: int  # where the key-value fields end: the bytes metadata_cache hashes


def read(path: Path) -> Header:
    with open(path, "rb") as f:
        count, metadata = _fields(f, path)
        metadata_end = f.tell()
        infos = [_tensor_info(f) for _ in range(count)]
        alignment = int(metadata.get("general.alignment", 32))
        start = -(-f.tell() // alignment) * alignment
    mapped = np.memmap(path, mode="r").view(np.ndarray)  # a plain view: slicing stays cheap
    tensors = []
    for name, dims, kind, offset in infos:
        qtype = GGMLQuantizationType(kind)
        block, size = GGML_QUANT_SIZES[qtype]
        rows = int(np.prod(dims[1:])) if len(dims) > 1 else 1
        row_bytes = dims[0] // block * size
        raw = mapped[start + offset:start + offset + rows * row_bytes]
        if qtype in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
            raw = raw.view(np.float32 if qtype is GGMLQuantizationType.F32 else np.float16)
            shape: tuple[int, ...] = tuple(reversed(dims))
        else:
            shape = (rows, row_bytes)
        tensors.append(Tensor(name, qtype, dims[0], raw.reshape(shape)))
    return Header(metadata, tensors, metadata_end)


def _fields(f: BinaryIO, path: Path) -> tuple[int, dict[str, Any]]:
    """(the tensors' count, the scalar and string fields), from the file's start; `f` is left where
    the tensors' descriptions begin."""
    if f.read(4) != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file")
    version, count, fields = struct.unpack("<IQQ", f.read(20))
    if version < 2:
        raise ValueError(f"{path}: GGUF version {version} is too old")
    return count, {_string(f): _value(f, _kind(f)) for _ in range(fields)}


def _kind(f: BinaryIO) -> int:
    return int(struct.unpack("<I", f.read(4))[0])


def _string(f: BinaryIO) -> str:
    (length,) = struct.unpack("<Q", f.read(8))
    return f.read(length).decode("utf-8", errors="replace")


def _value(f: BinaryIO, kind: int) -> Any:
    if kind == _STRING:
        return _string(f)
    if kind == _ARRAY:
        item, n = struct.unpack("<IQ", f.read(12))
        if item == _STRING:
            for _ in range(n):
                (length,) = struct.unpack("<Q", f.read(8))
                f.seek(length, os.SEEK_CUR)
        elif item in _SCALARS:
            f.seek(n * struct.calcsize("<" + _SCALARS[item]), os.SEEK_CUR)
        else:
            for _ in range(n):
                _value(f, item)
        return None  # arrays (the vocabulary) are the converters' business
    if kind not in _SCALARS:
        raise ValueError(f"GGUF: unknown metadata type {kind}")
    fmt = "<" + _SCALARS[kind]
    return struct.unpack(fmt, f.read(struct.calcsize(fmt)))[0]


def _tensor_info(f: BinaryIO) -> tuple[str, list[int], int, int]:
    name = _string(f)
    (dims,) = struct.unpack("<I", f.read(4))
    shape = list(struct.unpack(f"<{dims}Q", f.read(8 * dims)))
    kind, offset = struct.unpack("<IQ", f.read(12))
    return name, shape, kind, offset


def metadata_cache(path: Path, metadata_end: Optional[int] = None) -> Optional[Path]:
    """Where this file's config and tokenizer are kept (None: no writable cache folder);
    `metadata_end`: Header.metadata_end, where the caller has read the header already."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    if base.startswith("~"):
        return None
    return Path(base) / "llm-stream" / "gguf" / f"{path.stem}-{_metadata_hash(path, metadata_end)[:24]}"


def _metadata_hash(path: Path, end: Optional[int] = None) -> str:
    """SHA-256 of the header's key-value fields, the vocabulary's arrays included: the file's
    tensors do not change its config or tokenizer. Finding where they end walks the vocabulary's
    strings one by one (0.11 s for Gemma 3's, against 0.005 s for the hash of the bytes), so a
    caller that has read the header gives `end`, and a process that asks again for the same file
    unchanged (the executor's, at each reload after a keep-alive unload) hashes it once."""
    stat = path.stat()
    return _hash_of(path.resolve(), stat.st_size, stat.st_mtime_ns, end)


@functools.lru_cache(maxsize=64)
def _hash_of(path: Path, size: int, mtime_ns: int, end: Optional[int]) -> str:
    """_metadata_hash of the file as it is at (size, mtime_ns)."""
    with open(path, "rb") as f:
        if end is None:
            _fields(f, path)
            end = f.tell()
            f.seek(0)
        return hashlib.sha256(f.read(end)).hexdigest()


def find_gguf(source: str) -> Optional[tuple[str, str]]:
    """(folder, file name) when `source` is a .gguf file, or a folder holding exactly one
    .gguf and no config.json; None for anything else (a hub id, a transformers folder)."""
    path = Path(source)
    if path.is_file() and path.suffix == ".gguf":
        return str(path.parent), path.name
    if path.is_dir() and not (path / "config.json").exists():
        found = sorted(path.glob("*.gguf"))
        if len(found) > 1:
            raise ValueError(f"model: {source!r} holds {len(found)} .gguf files; "
                             f"point LLM_MODEL at one of them")
        if found:
            return str(path), found[0].name
    return None


def kept_tokenizer(source: str) -> Optional[Path]:
    """The folder where a GGUF model's config and tokenizer are kept from an earlier load
    (metadata_cache), as `config_and_tokenizer` reads them; None for a model of another kind, or
    one never loaded here. The executor's side builds the tokenizer from there itself
    (`saved_tokenizer`) while the engine process imports and loads, instead of unpickling the
    engine process's copy after it: the same object, and Gemma 3's start 0.5 s sooner."""
    try:
        found = find_gguf(source)
    except ValueError:
        return None
    if found is None:
        return None
    folder = metadata_cache(Path(found[0]) / found[1])
    return folder if folder is not None and _kept(folder) else None


def _kept(folder: Path) -> bool:
    """Whether a metadata_cache entry is there, whole (it appears by a rename, all or nothing)."""
    return (folder / "config.json").exists()


def config_and_tokenizer(path: Path, metadata_end: Optional[int] = None,
                         decoding_from: Optional[str] = None) -> tuple[Any, Any]:
    """transformers' config and tokenizer for the file, from the cache when they are there
    (`metadata_end`: as metadata_cache takes it). decoding_from: the kept folder whose tokenizer
    another process encodes with (the executor's, kept_tokenizer): where it is this file's, the
    tokenizer is built for decoding (decoding_tokenizer.py)."""
    from transformers import AutoConfig, AutoTokenizer  # transformers is slow to import: only here

    cached = metadata_cache(path, metadata_end)
    if cached is not None and _kept(cached):
        return AutoConfig.from_pretrained(cached), saved_tokenizer(cached, decoding=str(cached) == decoding_from)
    log.info("%s: reading its config and tokenizer from the file, once (kept under %s)", path.name,
             cached.parent if cached is not None else "no cache folder")
    with _one_reading(path):
        config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    for attr in ("quantization_config", "_name_or_path"):
        if hasattr(config, attr):
            delattr(config, attr)
    if cached is not None:
        with contextlib.suppress(OSError):
            partial = cached.with_name(cached.name + ".partial")
            config.save_pretrained(partial)
            tokenizer.save_pretrained(partial)
            decoding_tokenizer.write(partial)
            partial.rename(cached)  # all or nothing
        if (cached / "config.json").exists():
            tokenizer = saved_tokenizer(cached)  # the same object as every later start's
    return config, tokenizer


# tokenizer_config.json's settings that saved_tokenizer passes on as they are, and those it leaves
# out (the class, the backend and where it was loaded from); any other setting leaves the file to
# AutoTokenizer, which knows them all
_PLAIN_SETTINGS = frozenset({"bos_token", "eos_token", "unk_token", "pad_token", "mask_token", "sep_token",
                             "cls_token", "model_max_length", "add_bos_token", "add_eos_token",
                             "clean_up_tokenization_spaces", "chat_template"})
_NOT_SETTINGS = frozenset({"tokenizer_class", "backend", "is_local", "local_files_only"})


def saved_tokenizer(folder: Path, decoding: bool = False) -> Any:
    """The tokenizer kept in `folder`, built by the tokenizers library from its tokenizer.json
    (`decoding`: without its merges until it encodes, decoding_tokenizer.py, where the folder has
    them apart; a folder kept before they were gets them apart now, for its next start).

    transformers' classes for the GGUF architectures (GemmaTokenizer, LlamaTokenizer,
    Qwen2Tokenizer) differ from their base, TokenizersBackend, only in an __init__ that builds the
    pipeline from a vocabulary and merges: AutoTokenizer parses the 33 MB JSON of Gemma 3's
    262,144 tokens in Python to rebuild the pipeline that the file already holds, 2.6 s against
    1.2 on a 2-core machine, and the rebuilt object also pickled to twice the size (the engine
    process sends it to the executor's). The tokens, ids, texts and chat template are the same
    (tests/real_model/test_saved_tokenizer.py). AutoTokenizer is imported only where it is used:
    its module imports PyTorch (transformers' configuration code does), 0.4 s of the executor's
    start that its own tokenizer does not need."""
    from transformers import TokenizersBackend

    settings = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    if not (folder / "tokenizer.json").exists() or set(settings) - _PLAIN_SETTINGS - _NOT_SETTINGS:
        from transformers import AutoTokenizer
        return AutoTokenizer.from_pretrained(folder)
    template = folder / "chat_template.jinja"
    if template.exists():
        settings.setdefault("chat_template", template.read_text(encoding="utf-8"))
    plain = {key: value for key, value in settings.items() if key in _PLAIN_SETTINGS}
    if decoding:
        if (built := decoding_tokenizer.build(folder, plain)) is not None:
            return built
        if not decoding_tokenizer.written(folder):
            decoding_tokenizer.write(folder)
    return TokenizersBackend(tokenizer_file=str(folder / "tokenizer.json"), name_or_path=str(folder), **plain)


class _PlainReader(gguf.GGUFReader):
    """The package's reader over a plain ndarray view of the same mapping: the same fields,
    without memmap's cost per slice (16 s against 6 s for a 262k-token vocabulary)."""

    @property  # type: ignore[override]
    def data(self) -> np.ndarray:
        return self._plain

    @data.setter
    def data(self, value: np.ndarray) -> None:
        self._plain = value.view(np.ndarray)  # the memmap stays alive as the view's base


@contextlib.contextmanager
def _one_reading(path: Path) -> Iterator[None]:
    """transformers reads the file's metadata once for the config and once for the tokenizer:
    both get one reading, by the faster reader, and one parse of its fields (each caller gets a
    copy of the parse, which it may change). Gemma 3 270M's took 13.9 to 14.4 s instead of 15.2 to
    15.7 on a 2-core AVX2 machine."""
    from transformers import modeling_gguf_pytorch_utils as utils

    reader = _PlainReader(path)
    original, original_load = gguf.GGUFReader, utils.load_gguf_checkpoint
    parsed: dict[str, Any] = {}

    def reader_for(file: Any, *args: Any, **kwargs: Any) -> gguf.GGUFReader:
        return reader if Path(file).resolve() == path.resolve() else original(file, *args, **kwargs)

    def load_once(file: Any, return_tensors: bool = False, **kwargs: Any) -> dict:
        if return_tensors or kwargs or Path(file).resolve() != path.resolve():
            return original_load(file, return_tensors=return_tensors, **kwargs)
        if "fields" not in parsed:
            parsed["fields"] = original_load(file, return_tensors=False)
        return copy.deepcopy(parsed["fields"])

    gguf.GGUFReader = reader_for  # type: ignore[misc,assignment]
    utils.load_gguf_checkpoint = load_once  # type: ignore[assignment]
    try:
        yield
    finally:
        gguf.GGUFReader = original  # type: ignore[misc]
        utils.load_gguf_checkpoint = original_load
