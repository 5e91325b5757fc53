"""The embedding executor: DocList[EmbeddingDocument] in, each with its `.embedding` out.

Thin, as the LLM executor is: the engine's Embedder (engine/embeddings.py) does the work. Jina's
dynamic batching joins the inputs of requests that arrive together into one call, so concurrent
requests share the encoder's forward passes; each input's vector is the same bits whatever it is
batched with. The model: `model` under `with:`, else LLM_EMBEDDING_MODEL; empty turns embeddings
off (each request is then refused, saying so), absent means the bundled all-MiniLM-L6-v2 when
`make model` fetched it.

The model loads at the first embedding request, as Ollama loads a model when a request names
it: its imports and load (about 4 s of CPU and 0.46 GB for all-MiniLM-L6-v2) ran beside the
generating engine's at the service's start, on the same cores, and most users never embed. The
models' listings describe it before then, from its folder's config files
(engine/embedder_info.py). The requests that come while it loads wait for it; a load that fails
refuses the requests that waited for it, naming the model and the cause, and the next request
tries again. A model folder that cannot be described is refused, naming it, from the start.
"""
import json
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
from engine import EmbedderInfo, describe_embedder
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
        self._threads = threads or None
        self._embedder: Optional[Embedder] = None
        self._failed = ""  # why the model could not be described, or why its last load failed
        self._loading = threading.Lock()  # one load at a time; the requests meanwhile wait for it
        self._loads = 0  # loads ended, loaded or failed
        self._info: Optional[EmbedderInfo] = None
        if not self.source:
            self.logger.info("embeddings off (LLM_EMBEDDING_MODEL is empty, or `make model` has not fetched one)")
            return
        try:
            self._info = describe_embedder(self.source)
        except (OSError, ValueError) as exc:
            self._failed = f"{type(exc).__name__}: {exc}"
            self.logger.error(f"embedding model {self.source} cannot be served: {self._failed}")
            return
        self.logger.info(f"embedding model {self._info.model_id} ({self.source}): {self._info.dimensions} "
                         f"dimensions, {self._info.max_tokens} tokens an input; it loads at the first embedding")

    @property
    def embedder(self) -> Optional["Embedder"]:
        """The model, loaded now if it is not yet (the first request waits seconds, those beside it
        wait for the same load); None when none is served or the load failed (`_failed` says why)."""
        if self._embedder is not None or self._info is None:
            return self._embedder
        ended = self._loads  # loads ended before this request came: one that ends meanwhile is its answer
        with self._loading:
            if self._embedder is None and self._loads == ended:
                try:
                    from engine import Embedder
                    self._embedder = Embedder(self.source, self._threads)
                    self._failed = ""
                    self.logger.info(f"embedding model {self._info.model_id} loaded in "
                                     f"{self._embedder.info.load_seconds:.1f} s")
                except Exception as exc:  # noqa: BLE001 - these requests are refused with it; the next tries again
                    self._failed = f"{type(exc).__name__}: {exc}"
                    self.logger.error(f"embedding model {self.source} did not load: {self._failed}")
                finally:
                    self._loads += 1
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
        if self._info is None:
            self._refuse_unavailable(out)
        else:  # the loaded model's own, which says how long its load took; else the folder's
            out.text = json.dumps(asdict(self._embedder.info if self._embedder is not None else self._info))
        return DocList[EmbeddingDocument]([out])


def _refuse(doc: EmbeddingDocument, message: str, kind: ErrorKind = ErrorKind.VALIDATION) -> None:
    doc.error, doc.error_type, doc.error_field = message, kind.value, message.split(":")[0].split(".")[0]
