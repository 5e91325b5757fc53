"""The one skeleton every HTTP protocol shares, and what a protocol supplies to it.

`serve` does, for every route: read the request, build the document (or refuse naming
the field), open the stream, refuse with a status if the first document is an error,
then stream the events or collect the whole answer, 499 when the client left first. A
protocol supplies only its request mapping (`parse`) and its encoders (`refusal`,
`events`, `answer`). An SSE stream is kept for a reconnect (gateway/edge/resumable.py):
its events carry ids, and `Last-Event-ID` goes on from one. Handlers take any backend with
`open`, `complete` and `info`, so a fake one tests every protocol in milliseconds.
"""
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Optional
from typing import Protocol as Interface

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from contract import ErrorKind, ModelNotServedError, ServerInfo
from contract.transport import error_kind
from gateway.edge.backend import CollectedAnswer, Ends, cancel_on_disconnect, close_quietly, error_doc
from gateway.edge.resumable import ResumableDocs, streams, with_seed
from gateway.mapping.inputs import BadRequest
from schemas import EmbeddingDocument, ModelOutputDocument, PromptDocument

SSE = "text/event-stream"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def kind(out: ModelOutputDocument) -> ErrorKind:
    """The executor names the kind; the gateway only maps it (contract/transport.py)."""
    return error_kind(out.error_type)


def sse(data: Any, event: Optional[str] = None) -> str:
    """One Server-Sent Event; `data` is JSON-encoded unless it is a string already."""
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return (f"event: {event}\n" if event else "") + f"data: {payload}\n\n"


@dataclass
class Parsed:
    """A request as the skeleton needs it: the document, whether to stream, and the
    protocol's own parsed request for its encoders."""

    doc: PromptDocument
    stream: bool
    request: Any = None
    sent_as: dict[str, str] = field(default_factory=dict)  # an engine field -> the name this request used
    background: Optional[str] = None  # the id of a stream made whoever reads it (Responses' background)

    def as_sent(self, error: ModelOutputDocument) -> ModelOutputDocument:
        """The executor's refusal, naming the field as the client sent it (response_format
        rather than json_schema, say)."""
        name = self.sent_as.get(error.error_field or "")
        if name is None:
            return error
        message = error.error or ""
        if message.startswith(f"{error.error_field}:"):
            message = name + message[len(error.error_field or ""):]
        return error.model_copy(update={"error_field": name, "error": message})


class Upstream(Interface):
    """What a handler needs from the executor side (gateway.edge.backend.Backend, or a fake)."""

    async def open(self, doc: PromptDocument) -> tuple[ModelOutputDocument, AsyncIterator[ModelOutputDocument]]: ...

    async def complete(self, doc: PromptDocument) -> CollectedAnswer: ...

    async def info(self, model: Optional[str] = None) -> ServerInfo: ...

    async def models(self, live: bool = False) -> list[ServerInfo]: ...

    async def stats(self) -> dict: ...

    async def keep_alive(self, model: str, keep_alive: Optional[float]) -> ModelOutputDocument: ...

    async def metrics(self) -> str: ...

    async def tokenize(self, doc: PromptDocument) -> ModelOutputDocument: ...

    async def detokenize(self, doc: PromptDocument) -> ModelOutputDocument: ...

    async def embed(self, docs: list[EmbeddingDocument]) -> list[EmbeddingDocument]: ...

    async def embed_info(self, live: bool = False) -> Optional[dict]: ...


def embedding_state(info: dict) -> str:
    """The embedding model's state as the model listings say a model's: `loaded` once it has loaded
    (at the first embedding: its EmbedderInfo's `load_seconds` is 0 until then), else `unloaded`."""
    return "loaded" if info.get("load_seconds") else "unloaded"


class Protocol:
    """A wire format. Subclasses supply the mapping and the encoders."""

    media_type = SSE

    async def parse(self, request: Request, backend: Upstream) -> Parsed:
        raise NotImplementedError

    def refusal(self, error: ModelOutputDocument) -> Response:
        """The answer to a request refused before its first token (the status says why)."""
        raise NotImplementedError

    def events(self, parsed: Parsed, docs: AsyncIterator[ModelOutputDocument],
               info: Optional[ServerInfo]) -> AsyncIterator[str]:
        """The stream's frames; `docs` ends with a finished or an error document."""
        raise NotImplementedError

    def answer(self, parsed: Parsed, result: CollectedAnswer, info: Optional[ServerInfo]) -> Response:
        raise NotImplementedError

    def accepted(self, parsed: Parsed, info: Optional[ServerInfo]) -> Optional[Response]:
        """The answer to a background request that is not read as a stream (None: stream it)."""
        return None


async def serve(protocol: Protocol, backend: Upstream, request: Request) -> Response:
    last_event_id = request.headers.get("last-event-id")
    if last_event_id and protocol.media_type == SSE:
        return _resumed(protocol, request, last_event_id)
    try:
        parsed = await protocol.parse(request, backend)
        info = await backend.info(parsed.doc.model)  # a model none serves: 404 before any work
    except BadRequest as exc:
        return protocol.refusal(error_doc(str(exc), exc.kind, exc.param))
    except ModelNotServedError as exc:
        return protocol.refusal(error_doc(str(exc), exc.kind, exc.field))
    if not parsed.stream:
        result = await cancel_on_disconnect(request.receive, backend.complete(parsed.doc))
        if result is None:
            return Response(status_code=499)  # the client left; nobody reads this
        if result.error is not None:
            return protocol.refusal(parsed.as_sent(result.error))
        return protocol.answer(parsed, result, info)
    if protocol.media_type != SSE:
        first, rest = await backend.open(parsed.doc)
        if first.error is not None:
            await close_quietly(rest)
            return protocol.refusal(parsed.as_sent(first))
        return StreamingResponse(_frames(protocol, parsed, first, rest, info), media_type=protocol.media_type,
                                 headers=SSE_HEADERS)
    docs = ResumableDocs(backend.open, with_seed(parsed.doc))
    first = await docs.start()
    if first.error is not None:
        await docs.close()
        return protocol.refusal(parsed.as_sent(first))
    stored = streams().start(request.url.path, docs, protocol.events(parsed, docs, info), parsed.background,
                             background=parsed.background is not None, context=parsed.request)
    accepted = protocol.accepted(parsed, info) if parsed.background else None
    if accepted is not None:
        return accepted
    return StreamingResponse(streams().read(stored, 0), media_type=SSE, headers=SSE_HEADERS)


def _resumed(protocol: Protocol, request: Request, last_event_id: str) -> Response:
    """A reconnect: the events after the one it names, then the rest of the answer."""
    found = streams().find(request.url.path, last_event_id)
    if found is None:
        return protocol.refusal(error_doc(
            f"Last-Event-ID: {last_event_id!r} names no stream of {request.url.path} kept here (they are kept "
            f"LLM_RESUME_SECONDS after their reader left)", ErrorKind.NOT_FOUND, "Last-Event-ID"))
    return StreamingResponse(streams().read(*found), media_type=SSE, headers=SSE_HEADERS)


async def _documents(first: ModelOutputDocument, rest: AsyncIterator[ModelOutputDocument],
                     n: int) -> AsyncIterator[ModelOutputDocument]:
    """The stream's documents, to the last answer's final one (or an error)."""
    ends = Ends(n)
    yield first
    if not ends.last(first):
        async for out in rest:
            yield out
            if ends.last(out):
                return


async def _frames(protocol: Protocol, parsed: Parsed, first: ModelOutputDocument,
                  rest: AsyncIterator[ModelOutputDocument], info: Optional[ServerInfo]) -> AsyncIterator[str]:
    try:
        async for frame in protocol.events(parsed, _documents(first, rest, parsed.doc.n), info):
            yield frame
    finally:
        await close_quietly(rest)
