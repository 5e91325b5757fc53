"""An engine process's tokenizer that decodes from its start and gets its merges before it first
encodes.

Why: the engine process decodes every token it serves, but encodes only to find reasoning markers
and to build llguidance's view of the vocabulary for structured output. A BPE tokenizer's merges
(Gemma 3's: 514,906) are most of its parse, 0.5 of Gemma's 0.75 s, on the start's critical path,
and decoding never reads them (ids become tokens through the vocabulary, then the decoders).
Where the executor's side builds the same kept tokenizer itself (a GGUF's, gguf_file.py), so that
the engine process sends none, the engine process builds it from `decoding.json`: the kept
tokenizer.json without its merges, written beside it when it is kept.

Until `with_merges` puts the file's own BPE model (with its merges) in place, the tokenizer refuses
to encode (its pre-tokenizer raises) and to be pickled (a custom pre-tokenizer cannot be): an
encode that forgot to ask fails loudly, never with other ids. After, it is the kept tokenizer: the
same JSON, byte for byte (tests/unit/test_decoding_tokenizer.py).
"""
import contextlib
import json
import os
import threading
import weakref
from pathlib import Path
from typing import Any

DECODING = "decoding.json"  # beside a kept tokenizer.json: the same without its merges
NOTHING = "decoding.none"  # instead, where there is nothing to leave out: a folder looked at once
# each tokenizer built here, until with_merges: the tokenizer.json whose model it lacks, and its own
# pre-tokenizer (held here, not on the tokenizer: the engine sets no attribute of another's object)
_WITHOUT: "weakref.WeakKeyDictionary[Any, tuple[Path, Any]]" = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


class _Refuse:
    """The pre-tokenizer until the merges are in: every encode passes it first (the tokenizers
    library raises its own Exception, with this message)."""

    def pre_tokenize(self, pretokenized: Any) -> None:
        raise RuntimeError("this engine process's tokenizer decodes only until with_merges(tokenizer)")


def written(folder: Path) -> bool:
    """Whether `write` has looked at this folder's tokenizer (its JSON is not read again)."""
    return (folder / DECODING).exists() or (folder / NOTHING).exists()


def write(folder: Path) -> None:
    """decoding.json beside folder's tokenizer.json, where its model has merges (a BPE's) and it has
    a pre-tokenizer (`build` stands a refusing one in for it), else an empty decoding.none, so that
    no later load reads the JSON to find that out again; written beside its final name and renamed,
    so a reader finds it whole or not at all. Best effort: a folder it cannot write keeps the full
    parse."""
    spec = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    with contextlib.suppress(OSError):
        if not spec.get("model", {}).get("merges") or spec.get("pre_tokenizer") is None:
            (folder / NOTHING).touch()  # nothing to leave out; or no pre-tokenizer to stand in for
            return
        spec["model"]["merges"] = []
        partial = folder / (DECODING + ".partial")
        partial.write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
        os.replace(partial, folder / DECODING)


def build(folder: Path, settings: dict[str, Any]) -> Any:
    """The tokenizer kept in folder, for decoding: from decoding.json where it is there (None
    otherwise: the caller builds the full one). settings: tokenizer_config.json's, as
    gguf_file.saved_tokenizer passes them."""
    from tokenizers.pre_tokenizers import PreTokenizer
    from transformers import TokenizersBackend

    if not (folder / DECODING).exists():
        return None
    tokenizer = TokenizersBackend(tokenizer_file=str(folder / DECODING), name_or_path=str(folder), **settings)
    backend = tokenizer.backend_tokenizer
    with _LOCK:
        _WITHOUT[tokenizer] = (folder / "tokenizer.json", backend.pre_tokenizer)
    backend.pre_tokenizer = PreTokenizer.custom(_Refuse())
    return tokenizer


def with_merges(tokenizer: Any) -> Any:
    """The tokenizer, able to encode: one built by `build` gets its file's BPE model, merges and
    all, and its own pre-tokenizer back (once; thread-safe). Any other is returned as it is."""
    with _LOCK:
        full = _WITHOUT.get(tokenizer)
        if full is not None:
            from tokenizers import Tokenizer

            path, pre_tokenizer = full
            backend = tokenizer.backend_tokenizer
            backend.model = Tokenizer.from_file(str(path)).model
            backend.pre_tokenizer = pre_tokenizer
            del _WITHOUT[tokenizer]
    return tokenizer
