"""The gateway's one way to the executor, shared by every HTTP and WebSocket route.

Routes only translate wire formats: they build a PromptDocument, read
ModelOutputDocuments from `Backend.stream`, and render them. The guarantees live
here, once: a stream always ends with a final document (tokens with a
finish_reason, or an error document), and closing the stream closes the upstream
gRPC call, so the executor aborts the generation.
"""
import asyncio
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, Optional, TypeVar

import anyio
from docarray import DocList

from contract import ErrorKind, ServerInfo, resolve
from contract.endpoints import EMBED, EMBED_INFO, KEEP_ALIVE, MODELS
from schemas import EmbeddingDocument, ModelOutputDocument, PromptDocument

T = TypeVar("T")


EMBED_INFO_TRIES = 4  # the embedder's first call can fail just after the start, before its connection is up


def error_doc(message: str, kind: ErrorKind = ErrorKind.GENERATION,
              field: Optional[str] = None) -> ModelOutputDocument:
    return ModelOutputDocument(finish_reason="error", error=message, error_type=kind.value, error_field=field)


@dataclass
class Ends:
    """Whether a stream's document is its last: an error, or the end of its last answer (a
    request with n answers interleaves them, each ending with a finish_reason)."""

    n: int = 1
    ended: set[int] = field(default_factory=set)

    @classmethod
    def of(cls, doc: PromptDocument) -> "Ends":
        """For a request's answers: its `n`, one when it names none."""
        return cls(doc.n if isinstance(doc.n, int) and doc.n > 0 else 1)

    def last(self, out: ModelOutputDocument) -> bool:
        if out.finish_reason is not None:
            self.ended.add(out.choice_index)
        return out.error is not None or len(self.ended) >= self.n


@dataclass
class CollectedAnswer:
    """A whole generation collected from a stream (non-streaming routes)."""

    docs: list[ModelOutputDocument] = field(default_factory=list)
    last: Optional[ModelOutputDocument] = None
    first_ns: Optional[int] = None  # when the first document came (perf_counter_ns): the prompt's time

    @property
    def text(self) -> str:
        return "".join(d.text for d in self.docs)

    @property
    def error(self) -> Optional[ModelOutputDocument]:
        return self.last if self.last is not None and self.last.error is not None else None

    def answers(self) -> list[list[ModelOutputDocument]]:
        """Each answer's documents, in choice order (the last of each has its finish_reason)."""
        by_choice: dict[int, list[ModelOutputDocument]] = {}
        for doc in self.docs:
            by_choice.setdefault(doc.choice_index, []).append(doc)
        return [by_choice[c] for c in sorted(by_choice)]


class Backend:
    """Wraps Jina's GatewayStreamer: typed documents in and out, failures as documents."""

    def __init__(self, streamer: Any, endpoint: str = "/stream"):
        self.streamer = streamer
        self.endpoint = endpoint
        self._models: Optional[list[ServerInfo]] = None
        self._embed_info: Optional[dict] = None  # {}: asked, and none is served

    async def stream(self, doc: PromptDocument) -> AsyncGenerator[ModelOutputDocument, None]:
        """Yield the executor's documents; the last one always has finish_reason or error.

        Closing this generator (client gone, stop button) closes the upstream call.
        """
        ends = Ends.of(doc)
        try:
            async with aclosing(self.streamer.stream_doc(doc=doc, exec_endpoint=self.endpoint,
                                                          return_results=True)) as it:
                async for result, error in it:
                    if error:
                        yield error_doc(f"executor error: {error}")
                        return
                    # parsed straight into our type: Jina's default is a generic document,
                    # whose dict() and re-validation cost more than the parse itself
                    result.document_cls = ModelOutputDocument
                    out = result.data.doc
                    yield out
                    if ends.last(out):
                        return
        except (asyncio.CancelledError, GeneratorExit):
            raise
        except Exception as exc:  # noqa: BLE001 - the executor unreachable, a broken stream
            yield error_doc(f"{type(exc).__name__}: {exc}")
            return
        yield error_doc("the stream ended before its final document")

    async def open(self, doc: PromptDocument) -> tuple[ModelOutputDocument, AsyncIterator[ModelOutputDocument]]:
        """Start a stream and wait for its first document, so that validation and overload
        errors (which come before any token) can still become an HTTP status."""
        it = self.stream(doc)
        first = await it.__anext__()
        return first, it

    async def complete(self, doc: PromptDocument) -> CollectedAnswer:
        result = CollectedAnswer()
        async with aclosing(self.stream(doc)) as it:
            async for out in it:
                result.first_ns = result.first_ns or time.perf_counter_ns()
                result.last = out
                if out.error is None:
                    result.docs.append(out)
        return result

    async def _unary(self, endpoint: str) -> str:
        """The `text` of the executor's answer on a unary endpoint (JSON, or Prometheus text)."""
        return (await self._call(endpoint, PromptDocument())).text

    async def _call(self, endpoint: str, doc: PromptDocument) -> ModelOutputDocument:
        docs = DocList[PromptDocument]([doc])
        async for result in self.streamer.stream_docs(docs, exec_endpoint=endpoint,
                                                      return_type=DocList[ModelOutputDocument]):
            return result[0]
        raise RuntimeError(f"no answer from {endpoint}")

    async def embed(self, docs: list[EmbeddingDocument]) -> list[EmbeddingDocument]:
        """Each input with its embedding, or with an error (every input's, when the embedder is
        not there: none in this Flow, or unreachable)."""
        try:
            return [out for result in await self._embedder(EMBED, docs) for out in result]
        except Exception as exc:  # noqa: BLE001 - the embedder is absent or unreachable
            kind = ErrorKind.NOT_FOUND if isinstance(exc, LookupError) else ErrorKind.GENERATION
            return [EmbeddingDocument(error=f"embeddings: {exc}", error_type=kind.value, error_field="model")
                    for _ in docs]

    async def embed_info(self, live: bool = False) -> Optional[dict]:
        """The embedding model's EmbedderInfo (engine/embedder_info.py) as a dict; None when none is
        served. `live`: asked now (its `load_seconds` is 0 until the model has loaded, at the first
        embedding), else as first asked."""
        tries = EMBED_INFO_TRIES if self._embed_info is None else 1 if live else 0  # live: once, else as known
        for attempt in range(tries):
            try:
                [out] = [out for result in await self._embedder(EMBED_INFO, [EmbeddingDocument()]) for out in result]
            except LookupError:  # this Flow has no embedding deployment
                return None
            except Exception:  # noqa: BLE001 - not reached yet (just after the start): again, then next time
                if attempt + 1 < tries:
                    await asyncio.sleep(0.5)
                continue
            self._embed_info = json.loads(out.text) if out.error is None else {}
            break
        return self._embed_info or None

    async def _embedder(self, endpoint: str, docs: list[EmbeddingDocument]) -> list[DocList[EmbeddingDocument]]:
        return [result async for result in self.streamer.stream_docs(
            DocList[EmbeddingDocument](docs), exec_endpoint=endpoint, request_size=max(1, len(docs)),
            return_type=DocList[EmbeddingDocument])]

    async def tokenize(self, doc: PromptDocument) -> ModelOutputDocument:
        """The document's prompt (or chat) as token ids, in `token_ids`; or an error document."""
        return await self._call("/tokenize", doc)

    async def detokenize(self, doc: PromptDocument) -> ModelOutputDocument:
        """The document's `prompt_token_ids` as text; or an error document."""
        return await self._call("/detokenize", doc)

    async def models(self, live: bool = False) -> list[ServerInfo]:
        """Each served model's id and limits, the default one first (cached: they never change);
        `live`: asked now, with each one's state (loaded or not) and expiry."""
        if self._models is None or live:
            self._models = [ServerInfo.from_json(json.dumps(info)) for info in json.loads(await self._unary(MODELS))]
        return self._models

    async def info(self, model: Optional[str] = None) -> ServerInfo:
        """The id and limits of the model that `model` names (the first for none); a name that no
        model has raises ModelNotServedError, naming the served ones."""
        return model_info(await self.models(), model)

    async def keep_alive(self, model: str, keep_alive: Optional[float]) -> ModelOutputDocument:
        """Load `model` and keep it `keep_alive` seconds from now (None: the server's; negative:
        for good), or with 0 unload it once its requests end: its info as JSON, or an error document."""
        return await self._call(KEEP_ALIVE, PromptDocument(model=model, keep_alive=keep_alive))

    async def stats(self) -> dict:
        return json.loads(await self._unary("/stats"))

    async def metrics(self) -> str:
        return await self._unary("/metrics")


def model_info(models: list[ServerInfo], name: Optional[str]) -> ServerInfo:
    """The info of the model `name` names, among the served ones (ModelNotServedError: none)."""
    return resolve(name, models)


async def close_quietly(gen: AsyncIterator) -> None:
    """Close a stream even from a cancelled task (client gone): shielded, so the upstream
    call is really closed and the executor aborts the generation."""
    with anyio.CancelScope(shield=True):
        await gen.aclose()  # type: ignore[attr-defined]


def now() -> int:
    return int(time.time())


async def cancel_on_disconnect(receive: Any, coro: Awaitable[T]) -> Optional[T]:
    """Run a non-streaming request, cancelling it (and so its generation) when the client
    goes away; returns None then. `receive` is the ASGI receive of a request whose body
    was read already, so its next message can only be the disconnect.

    The task is cancelled however the watcher ends before it: the disconnect, but also
    `receive` raising or the watcher being cancelled (even before it ran), since then
    nothing would notice the client leave and the generation would run on to max_tokens
    for nobody. The watcher is stopped only once the task is done, so no disconnect goes
    unseen while the task runs. A cancellation of the caller itself is passed on."""
    task = asyncio.ensure_future(coro)

    async def watch() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(watch())
    watcher.add_done_callback(lambda _: task.cancel())  # a no-op once the task is done
    try:
        return await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if watcher.done() and not (current and current.cancelling()):
            return None  # the client left (or can no longer be heard): nobody reads the answer
        raise
    finally:
        watcher.cancel()
