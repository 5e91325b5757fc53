"""The embedding executor: DocList[EmbeddingDocument] in, each with its `.embedding` out.

Thin, as the LLM executor is: the engine's Embedder (engine/embeddings.py) does the work. Jina's
dynamic batching joins the inputs of requests that arrive together into one call, so concurrent
requests share the encoder's forward passes; each input's vector is the same bits whatever it is
batched with. The model: `model` under `with:`, else LLM_EMBEDDING_MODEL; empty turns embeddings
off (each request is then refused, saying so), absent means the bundled all-MiniLM-L6-v2 when
`make model` fetched it.

The model loads on a thread of its own, at the lowest CPU priority, while the executor serves:
its imports and load (about 5 s of CPU for all-MiniLM-L6-v2) would otherwise run beside the
generating engine's on the same cores and delay the service's first answer by about 2 s. An
embedding request that comes before the load ends waits for it; one whose model failed to load
is refused, naming the model.
"""
import json
import os
import threading
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import numpy as np
from docarray import DocList
from docarray.typing import NdArray
from jina import Executor, dynamic_batching, requests

from contract import ErrorKind, settings
from contract.endpoints import EMBED, EMBED_INFO
from contract.lifecycle import die_with_parent
from executors import discovery
from schemas import EmbeddingDocument

if TYPE_CHECKING:
    from engine import Embedder

die_with_parent()
discovery.install()  # the endpoints' schemas computed once, not at every gateway's ask

DEFAULT_MODEL = "models/all-MiniLM-L6-v2"  # `make model` puts the bundled model here


def embedding_source(model: str = "") -> str:
    """The model to serve: `with:`'s, LLM_EMBEDDING_MODEL's (empty: none), or the bundled one if present."""
    if model:
        return model
    if settings.is_set("LLM_EMBEDDING_MODEL"):  # blank: none
        return settings.read("LLM_EMBEDDING_MODEL")
    return DEFAULT_MODEL if (Path(DEFAULT_MODEL) / "config.json").exists() else ""


class EmbeddingExecutor(Executor):
    def __init__(self, model: str = "", threads: int = 0, **kwargs: Any):
        die_with_parent()
        super().__init__(**kwargs)
        discovery.prepare(self)
        self.source = embedding_source(model)
        self._embedder: Optional[Embedder] = None
        self._failed = ""  # why the model did not load
        self._loaded = threading.Event()
        if self.source:
            threading.Thread(target=self._load, args=(threads or None,), name="llm-embedder-load", daemon=True).start()
        else:
            self._loaded.set()
            self.logger.info("embeddings off (LLM_EMBEDDING_MODEL is empty, or `make model` has not fetched one)")

    def _load(self, threads: Optional[int]) -> None:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)  # Linux: this thread alone
        except (OSError, AttributeError):  # elsewhere: at the same priority
            pass
        try:
            from engine import Embedder
            self._embedder = Embedder(self.source, threads)
            info = self._embedder.info
            self.logger.info(f"embedding model {info.model_id} ({self.source}): {info.dimensions} dimensions, "
                             f"{info.max_tokens} tokens an input, loaded in {info.load_seconds:.1f} s")
        except Exception as exc:  # noqa: BLE001 - each request is refused with it; the service serves on
            self._failed = f"{type(exc).__name__}: {exc}"
            self.logger.error(f"embedding model {self.source} did not load: {self._failed}")
        finally:
            self._loaded.set()

    @property
    def embedder(self) -> Optional["Embedder"]:
        """The model, once loaded (waiting for its load); None when none is served or it failed to."""
        self._loaded.wait()
        return self._embedder

    def _refuse_unavailable(self, doc: EmbeddingDocument) -> None:
        """Refused, the field `model`: the model failed to load (naming it), or none is served."""
        if self._failed:
            _refuse(doc, f"model: the embedding model {self.source} did not load ({self._failed})", ErrorKind.GENERATION)
        else:
            _refuse(doc, "model: no embedding model is served (LLM_EMBEDDING_MODEL is empty)", ErrorKind.NOT_FOUND)

    @requests(on=EMBED)
    @dynamic_batching(preferred_batch_size=64, timeout=2)
    def embed(self, docs: DocList[EmbeddingDocument], **kwargs: Any) -> DocList[EmbeddingDocument]:
        """Each input embedded, or refused (too long with truncate off, token ids outside the vocabulary)."""
        embedder = self.embedder
        if embedder is None:
            for doc in docs:
                self._refuse_unavailable(doc)
            return docs
        ids = [list(d.token_ids) if d.token_ids else [] for d in docs]
        texts = [i for i, d in enumerate(docs) if not d.token_ids]
        for i, one in zip(texts, embedder.tokens([docs[i].text for i in texts]), strict=True):
            ids[i] = one
        vocabulary = len(embedder.tokenizer)
        good = []
        for i, (doc, one) in enumerate(zip(docs, ids, strict=True)):
            if any(t < 0 or t >= vocabulary for t in one):
                _refuse(doc, f"input.{i}: token ids must be between 0 and {vocabulary - 1}")
            elif len(one) > embedder.max_tokens and not doc.truncate:
                _refuse(doc, f"input.{i}: {len(one)} tokens, more than the model's {embedder.max_tokens}")
            else:
                good.append(i)
        vectors = embedder.embed([ids[i] for i in good])
        for i, vector in zip(good, vectors, strict=True):
            docs[i].embedding = NdArray._docarray_from_native(np.asarray(vector, dtype=np.float32))
            docs[i].prompt_tokens = min(len(ids[i]), embedder.max_tokens)
        return docs

    @requests
    def passed_on(self, docs: DocList[EmbeddingDocument], **kwargs: Any) -> None:
        """Any other endpoint: nothing to do. Jina's graph of the Flow puts this executor after
        llm and wants every endpoint of llm's to be taken here; the gateway never sends one."""

    @requests(on=EMBED_INFO)
    def info(self, docs: DocList[EmbeddingDocument], **kwargs: Any) -> DocList[EmbeddingDocument]:
        """The model's EmbedderInfo as JSON text (`text` of the one document), or an error when off."""
        out = EmbeddingDocument()
        embedder = self.embedder
        if embedder is None:
            self._refuse_unavailable(out)
        else:
            out.text = json.dumps(asdict(embedder.info))
        return DocList[EmbeddingDocument]([out])


def _refuse(doc: EmbeddingDocument, message: str, kind: ErrorKind = ErrorKind.VALIDATION) -> None:
    doc.error, doc.error_type, doc.error_field = message, kind.value, message.split(":")[0].split(".")[0]
