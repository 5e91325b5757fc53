"""The executor's side builds a GGUF model's tokenizer itself, from where an earlier load kept it.

The engine process parses the tokenizer at each load and, before this, pickled it to the
executor's side, which unpickled it: a second parse there (Gemma 3's 262,144 tokens: 0.8 s to
parse, 0.3 s to pickle, a second to unpickle), after the engine process's, on the load's path.
Where the model is a GGUF file loaded here before, its tokenizer is kept in a folder
(gguf_file.kept_tokenizer), which both sides read with the same function (`saved_tokenizer`):
this side builds its copy on a thread as it sends the load, while the engine process still
imports, and the engine process answers TokenizerKept when its own came from the same folder.
Otherwise (a first load, a folder, a hub id) the engine process sends its tokenizer as before.
Alternating starts of Gemma 3 270M to the first completion (AVX-512 machine, 2026-12-07, 5 rounds
each, medians): 5.60 s before, 4.94 s after.
"""
import logging
import threading
from pathlib import Path
from typing import Any, Optional

log = logging.getLogger(__name__)


class KeptTokenizer:
    """The tokenizer kept for `model` (folder None: none is kept), built on a thread once started.

    The caller sends the load first, then starts the build: the parse holds the interpreter (the
    tokenizers library does not let go of it), and a build started before the send could hold
    the load back for as long (Gemma 3's: up to 1.2 s from asking for an engine process to its
    load being sent, against 0.3 s when sent first)."""

    def __init__(self, model: str):
        from ..model.gguf_file import kept_tokenizer  # the gguf package: only where a load starts

        self._found = kept_tokenizer(model)
        self.folder: Optional[str] = str(self._found) if self._found is not None else None
        self._tokenizer: Any = None
        self._error: Optional[BaseException] = None
        self._thread: Optional[threading.Thread] = None

    def start(self) -> "KeptTokenizer":
        """The build begun on its thread, where a tokenizer is kept (once)."""
        if self._found is not None and self._thread is None:
            self._thread = threading.Thread(target=self._build, args=(self._found,), name="llm-kept-tokenizer",
                                            daemon=True)
            self._thread.start()
        return self

    def _build(self, found: Path) -> None:
        from ..model.gguf_file import saved_tokenizer

        try:
            self._tokenizer = saved_tokenizer(found)
        except BaseException as exc:  # noqa: BLE001 - raised where the load waits for it
            self._error = exc

    def result(self) -> Any:
        """The tokenizer (waited for); a RuntimeError naming the folder where it could not be built."""
        if self._thread is None:
            raise RuntimeError("the engine process named a kept tokenizer that this side does not build")
        self._thread.join()
        if self._error is not None:
            raise RuntimeError(f"could not build the tokenizer kept in {self.folder}: {self._error}") from self._error
        return self._tokenizer
