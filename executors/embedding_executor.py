"""The embedding executor: DocList[EmbeddingDocument] in, each with its `.embedding` out.

Thin, as the LLM executor is: the engine's Embedder (engine/embeddings.py) does the work. Jina's
dynamic batching joins the inputs of requests that arrive together into one call, so concurrent
requests share the encoder's forward passes; each input's vector is the same bits whatever it is
batched with. The model: `model` under `with:`, else LLM_EMBEDDING_MODEL; empty turns embeddings
off (each request is then refused, saying so), absent means the bundled all-MiniLM-L6-v2 when
`make model` fetched it.
"""
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional

import numpy as np
from docarray import DocList
from docarray.typing import NdArray
from jina import Executor, dynamic_batching, requests

from contract import ErrorKind, settings
from contract.endpoints import EMBED, EMBED_INFO
from contract.lifecycle import die_with_parent
from engine import Embedder
from schemas import EmbeddingDocument

die_with_parent()

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
        source = embedding_source(model)
        self.embedder: Optional[Embedder] = Embedder(source, threads or None) if source else None
        if self.embedder is None:
            self.logger.info("embeddings off (LLM_EMBEDDING_MODEL is empty, or `make model` has not fetched one)")
        else:
            info = self.embedder.info
            self.logger.info(f"embedding model {info.model_id} ({source}): {info.dimensions} dimensions, "
                             f"{info.max_tokens} tokens an input, loaded in {info.load_seconds:.1f} s")

    @requests(on=EMBED)
    @dynamic_batching(preferred_batch_size=64, timeout=2)
    def embed(self, docs: DocList[EmbeddingDocument], **kwargs: Any) -> DocList[EmbeddingDocument]:
        """Each input embedded, or refused (too long with truncate off, token ids outside the vocabulary)."""
        if self.embedder is None:
            for doc in docs:
                _refuse(doc, "model: no embedding model is served (LLM_EMBEDDING_MODEL is empty)", ErrorKind.NOT_FOUND)
            return docs
        ids = [list(d.token_ids) if d.token_ids else [] for d in docs]
        texts = [i for i, d in enumerate(docs) if not d.token_ids]
        for i, one in zip(texts, self.embedder.tokens([docs[i].text for i in texts]), strict=True):
            ids[i] = one
        vocabulary = len(self.embedder.tokenizer)
        good = []
        for i, (doc, one) in enumerate(zip(docs, ids, strict=True)):
            if any(t < 0 or t >= vocabulary for t in one):
                _refuse(doc, f"input.{i}: token ids must be between 0 and {vocabulary - 1}")
            elif len(one) > self.embedder.max_tokens and not doc.truncate:
                _refuse(doc, f"input.{i}: {len(one)} tokens, more than the model's {self.embedder.max_tokens}")
            else:
                good.append(i)
        vectors = self.embedder.embed([ids[i] for i in good])
        for i, vector in zip(good, vectors, strict=True):
            docs[i].embedding = NdArray._docarray_from_native(np.asarray(vector, dtype=np.float32))
            docs[i].prompt_tokens = min(len(ids[i]), self.embedder.max_tokens)
        return docs

    @requests
    def passed_on(self, docs: DocList[EmbeddingDocument], **kwargs: Any) -> None:
        """Any other endpoint: nothing to do. Jina's graph of the Flow puts this executor after
        llm and wants every endpoint of llm's to be taken here; the gateway never sends one."""

    @requests(on=EMBED_INFO)
    def info(self, docs: DocList[EmbeddingDocument], **kwargs: Any) -> DocList[EmbeddingDocument]:
        """The model's EmbedderInfo as JSON text (`text` of the one document), or an error when off."""
        out = EmbeddingDocument()
        if self.embedder is None:
            _refuse(out, "model: no embedding model is served (LLM_EMBEDDING_MODEL is empty)", ErrorKind.NOT_FOUND)
        else:
            out.text = json.dumps(asdict(self.embedder.info))
        return DocList[EmbeddingDocument]([out])


def _refuse(doc: EmbeddingDocument, message: str, kind: ErrorKind = ErrorKind.VALIDATION) -> None:
    doc.error, doc.error_type, doc.error_field = message, kind.value, message.split(":")[0].split(".")[0]
