"""Jina's SSE route, GET /stream, on the gateway's own terms.

The wire format is Jina's, so Jina's HTTP client (`Client(protocol='http').stream_doc`)
works unchanged: the request is the PromptDocument as a JSON body (or as query
parameters), and each ModelOutputDocument comes as `event: update` / `data: {...}`,
then `event: end`. Jina's own route builds the document from a model it derives from
the executor's JSON schema, which cannot carry a seed past int32; this one uses
PromptDocument itself. A request refused before its first token gets its status code
(422 validation, 429 overloaded), with the error document as the one event, so that
curl sees the status and Jina's client still reads the error.
"""
import json
from typing import Any, AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from schemas import ModelOutputDocument

from gateway.backend import SSE_HEADERS, STATUS, Backend, BadRequest, close_quietly, prompt_document

LIST_FIELDS = ("stop",)  # in a query string: repeated, or one JSON list


END = "event: end\r\n\r\n"


def _event(out: ModelOutputDocument) -> str:
    """Byte for byte what Jina's server writes: Jina's client cuts the JSON out at a fixed
    offset after `event: ` and so needs the CRLF line ends."""
    return f"event: update\r\ndata: {json.dumps(out.model_dump(mode='json'))}\r\n\r\n"


async def _events(first: ModelOutputDocument, rest: AsyncIterator[ModelOutputDocument]) -> AsyncIterator[str]:
    try:
        out = first
        while out is not None:
            yield _event(out)
            if out.error is not None or out.finish_reason is not None:
                break
            out = await anext(rest, None)
        yield END
    finally:
        await close_quietly(rest)


def _refusal(out: ModelOutputDocument, status: int) -> StreamingResponse:
    async def body() -> AsyncIterator[str]:
        yield _event(out)
        yield END
    return StreamingResponse(body(), status_code=status, media_type="text/event-stream",
                             headers=SSE_HEADERS)


async def _fields(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if raw.strip():
        try:
            fields = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise BadRequest(f"request body is not valid JSON: {exc}") from None
        except RecursionError:
            raise BadRequest("request body: JSON nested too deeply") from None
        if not isinstance(fields, dict):
            raise BadRequest("request body must be a JSON object (a PromptDocument)")
        return fields
    fields: dict[str, Any] = dict(request.query_params)
    for name in LIST_FIELDS:  # ?stop=a&stop=b, or ?stop=["a","b"]
        values = request.query_params.getlist(name)
        if len(values) == 1 and values[0].startswith("["):
            try:
                values = json.loads(values[0])
            except (json.JSONDecodeError, RecursionError):
                raise BadRequest(f"{name}: not a JSON list", name) from None
        if values:
            fields[name] = values
    return fields


def jina_sse_router(backend: Backend) -> APIRouter:
    router = APIRouter(tags=["Jina"])

    @router.get("/stream", summary="Jina SSE: one `update` event per document, then `end`")
    async def stream(request: Request) -> StreamingResponse:
        try:
            doc = prompt_document(**await _fields(request))
        except BadRequest as exc:
            return _refusal(ModelOutputDocument(finish_reason="error", error=str(exc), error_type="validation",
                                                error_field=exc.param), STATUS["validation"])
        first, rest = await backend.open(doc)
        if first.error is not None:
            await close_quietly(rest)
            return _refusal(first, STATUS.get(first.error_type or "", 500))
        return StreamingResponse(_events(first, rest), media_type="text/event-stream",
                                 headers=SSE_HEADERS)

    return router
