"""The gateway tier's fake upstream: the real routes, a scripted executor, milliseconds."""
from collections.abc import AsyncIterator

import numpy as np
from fastapi import FastAPI
from fastapi.testclient import TestClient

from contract import RequestLimits, ServerInfo
from gateway.edge.backend import CollectedAnswer, model_info
from gateway.edge.http_guard import install_unrouted
from gateway.protocols.anthropic_routes import anthropic_router
from gateway.protocols.embedding_routes import embedding_router
from gateway.protocols.jina_sse import jina_sse_router
from gateway.protocols.ollama_routes import ollama_router
from gateway.protocols.openai_routes import openai_router
from gateway.protocols.responses_routes import responses_router
from gateway.protocols.tgi_routes import tgi_router
from gateway.protocols.tokens_routes import tokens_router
from schemas import EmbeddingDocument, ModelOutputDocument, PromptDocument

INFO = ServerInfo(model_id="fake-model", max_context=512, max_tokens_limit=100, max_running=2, max_waiting=2,
                  max_batch_tokens=1024, max_prefill_tokens=512, **RequestLimits().as_dict(), dtype="float32",
                  device="cpu", chat_template=True, architecture="llama", parameters=135_000_000,
                  weight_bytes=90_000_000)


EMBEDDING = {"model_id": "fake-embedder", "dimensions": 3, "max_tokens": 16, "pooling": "mean", "normalized": True,
             "load_seconds": 0.1, "architecture": "bert", "parameters": 22_000_000}


def tokens(*texts: str, finish: str = "length", seed=None) -> list[ModelOutputDocument]:
    out, text = [], ""
    for i, t in enumerate(texts):
        text += t
        last = i == len(texts) - 1
        out.append(ModelOutputDocument(token_id=i, token_ids=[i], text=t, generated_text=text, index=i,
                                       logprobs=[-0.5], specials=[False], texts=[t], finish_reason=finish if last else None,
                                       generated_tokens=len(texts) if last else None,
                                       prompt_tokens=3 if last else None, seed=seed if last else None))
    return out


class FakeUpstream:
    """Answers every request with `script`, and keeps the documents it was sent."""

    def __init__(self) -> None:
        self.script = tokens("Hello", " world")
        self.sent: list[PromptDocument] = []
        self.embedding: dict | None = dict(EMBEDDING)  # the embedding model's info; None: none is served
        self.served = [INFO]  # the generating models, the default first
        self.kept: list[tuple] = []  # keep_alive calls: (model, seconds)

    async def _docs(self) -> AsyncIterator[ModelOutputDocument]:
        for d in self.script[1:]:
            yield d

    async def open(self, doc):
        self.sent.append(doc)
        return self.script[0], self._docs()

    async def complete(self, doc):
        self.sent.append(doc)
        done = [d for d in self.script if d.error is None]
        return CollectedAnswer(done, self.script[-1])

    async def models(self, live=False):
        return self.served

    async def keep_alive(self, model, keep_alive):
        self.kept.append((model, keep_alive))
        return ModelOutputDocument(text=model_info(self.served, model).to_json())

    async def info(self, model=None):
        return model_info(self.served, model)

    async def stats(self):
        return {"healthy": True}

    async def tokenize(self, doc):
        """Token ids as the fake tokenizer makes them: one per character of the prompt or messages."""
        self.sent.append(doc)
        text = doc.messages or doc.prompt
        return ModelOutputDocument(token_ids=[ord(c) % 1000 for c in text], prompt_tokens=len(text))

    async def embed(self, docs):
        """A vector per input: its length in characters (or token ids), then 1 and 0."""
        self.sent.extend(docs)
        if self.embedding is None:
            return [EmbeddingDocument(error="model: no embedding model", error_type="not_found", error_field="model")
                    for _ in docs]
        return [EmbeddingDocument(text=d.text, token_ids=d.token_ids, prompt_tokens=len(d.text or d.token_ids),
                                  embedding=np.array([len(d.text or d.token_ids), 1, 0], dtype=np.float32)) for d in docs]

    async def embed_info(self, live=False):
        return self.embedding

    async def detokenize(self, doc):
        self.sent.append(doc)
        return ModelOutputDocument(text="".join(chr(i) for i in doc.prompt_token_ids))


def routes_app(fake: FakeUpstream) -> TestClient:
    """Every protocol's routes on one app, answered by `fake`."""
    app = FastAPI()
    install_unrouted(app)
    for router in (openai_router(fake), tgi_router(fake), jina_sse_router(fake), anthropic_router(fake),
                   responses_router(fake), tokens_router(fake), ollama_router(fake),
                   embedding_router(fake)):
        app.include_router(router)
    return TestClient(app)
