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
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Optional, TypeVar, Union

import anyio
from docarray import DocList
from fastapi import Request
from pydantic import BaseModel, StrictBool, StrictFloat, StrictInt, ValidationError

from schemas import ModelOutputDocument, PromptDocument

from executors.engine.errors import ValidationError as LimitError
from executors.engine.limits import RequestLimits

T = TypeVar("T")

# Request-model field types that do not coerce: JSON true is not 1, "0.5" is not 0.5
Int = Optional[StrictInt]
Number = Optional[Union[StrictInt, StrictFloat]]
Bool = Optional[StrictBool]

# HTTP status per error_type; the executor names the type, the gateway only maps it
STATUS = {"validation": 422, "not_found": 404, "overloaded": 429, "generation": 500, "internal": 500}


ModelT = TypeVar("ModelT", bound=BaseModel)
LIMITS = RequestLimits.from_env()  # the executor reads the same variables


class BadRequest(ValueError):
    """A request body that does not parse; `param` names the field when there is one."""

    def __init__(self, message: str, param: Optional[str] = None):
        super().__init__(message)
        self.param = param


def bad_request(exc: ValidationError) -> BadRequest:
    """Pydantic's first error, as `field: message` naming the field."""
    first = exc.errors()[0]
    where = ".".join(str(x) for x in first["loc"])
    message = first["msg"].removeprefix("Value error, ")
    return BadRequest(f"{where}: {message}", where)


async def parse_body(request: Request, model: type[ModelT]) -> ModelT:
    """The body as JSON whatever the Content-Type (curl -d sends form-encoded)."""
    try:
        data = json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise BadRequest("request body: JSON nested too deeply") from None
    check_text(data)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise bad_request(exc) from None


def check_text(value: Any, path: str = "") -> None:
    """Every string must be encodable: JSON's `\\ud800` escapes decode to lone surrogates,
    which no wire format below can carry. The error names where the bad string is."""
    stack = [(path, value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise BadRequest(f"{where or 'body'}: not valid Unicode text (a lone surrogate)",
                                 where.split(".")[0] or None) from None
        elif isinstance(item, dict):
            stack += [(f"{where}.{k}" if where else str(k), v) for k, v in item.items()]
        elif isinstance(item, list):
            stack += [(f"{where}.{i}", v) for i, v in enumerate(item)]


def prompt_document(**fields: Any) -> PromptDocument:
    """A route's PromptDocument, after the request limits (cheapest first) and a check of its
    text; a value the document cannot carry (a seed past 2**64 - 1, an integer past int32)
    is a BadRequest naming the field, before anything is sent. `messages` may be a list."""
    try:
        LIMITS.check_prompt(fields.get("prompt"))
        LIMITS.check_stop(fields.get("stop"))
        LIMITS.check_messages(fields.get("messages"))
    except LimitError as exc:
        raise BadRequest(str(exc), exc.field) from None
    check_text(fields)
    if isinstance(fields.get("messages"), list):
        fields["messages"] = json.dumps(fields["messages"])
    try:
        return PromptDocument(**fields)
    except ValidationError as exc:
        raise bad_request(exc) from None


def error_doc(message: str, error_type: str = "generation") -> ModelOutputDocument:
    return ModelOutputDocument(finish_reason="error", error=message, error_type=error_type)


def sse(data: Any, event: Optional[str] = None) -> str:
    """One Server-Sent Event; `data` is JSON-encoded unless it is a string already."""
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return (f"event: {event}\n" if event else "") + f"data: {payload}\n\n"


SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


@dataclass
class Completion:
    """A whole generation collected from a stream (non-streaming routes)."""

    docs: list[ModelOutputDocument] = field(default_factory=list)
    last: Optional[ModelOutputDocument] = None

    @property
    def text(self) -> str:
        return "".join(d.text for d in self.docs)

    @property
    def error(self) -> Optional[ModelOutputDocument]:
        return self.last if self.last is not None and self.last.error is not None else None


class Backend:
    """Wraps Jina's GatewayStreamer: typed documents in and out, failures as documents."""

    def __init__(self, streamer: Any, endpoint: str = "/stream"):
        self.streamer = streamer
        self.endpoint = endpoint
        self._info: Optional[dict] = None

    async def stream(self, doc: PromptDocument) -> AsyncIterator[ModelOutputDocument]:
        """Yield the executor's documents; the last one always has finish_reason or error.

        Closing this generator (client gone, stop button) closes the upstream call.
        """
        try:
            async with aclosing(self.streamer.stream_doc(doc=doc, exec_endpoint=self.endpoint)) as it:
                async for out, error in it:
                    if error:
                        yield error_doc(f"executor error: {error}")
                        return
                    if not isinstance(out, ModelOutputDocument):
                        out = ModelOutputDocument.parse_obj(out.dict())
                    yield out
                    if out.error is not None or out.finish_reason is not None:
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

    async def complete(self, doc: PromptDocument) -> Completion:
        result = Completion()
        async with aclosing(self.stream(doc)) as it:
            async for out in it:
                result.last = out
                if out.error is None:
                    result.docs.append(out)
        return result

    async def _unary(self, endpoint: str) -> dict:
        docs = DocList[PromptDocument]([PromptDocument()])
        async for result in self.streamer.stream_docs(docs, exec_endpoint=endpoint,
                                                      return_type=DocList[ModelOutputDocument]):
            return json.loads(result[0].text)
        raise RuntimeError(f"no answer from {endpoint}")

    async def info(self) -> dict:
        """Model id and limits from the executor's '/info' endpoint (cached: they never change)."""
        if self._info is None:
            self._info = await self._unary("/info")
        return self._info

    async def stats(self) -> dict:
        return await self._unary("/stats")


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
    was read already, so its next message can only be the disconnect."""
    task = asyncio.ensure_future(coro)

    async def watch() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        task.cancel()

    watcher = asyncio.ensure_future(watch())
    try:
        return await task
    except asyncio.CancelledError:
        if watcher.done():  # the client left: nobody reads the answer
            return None
        raise
    finally:
        watcher.cancel()
