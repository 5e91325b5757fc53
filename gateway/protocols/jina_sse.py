"""Jina's SSE route, GET /stream, on the gateway's own terms.

The wire format is Jina's, so Jina's HTTP client (`Client(protocol='http').stream_doc`)
works unchanged: the request is the PromptDocument as a JSON body (or as query
parameters), and each ModelOutputDocument comes as `event: update` / `data: {...}`,
then `event: end`. Jina's own route builds the document from a model it derives from
the executor's JSON schema, which cannot carry a seed past int32; this one uses
PromptDocument itself. A request refused before its first token gets its status code
(422 validation, 429 overloaded), with the error document as the one event, so that
curl sees the status and Jina's client still reads the error. A field that PromptDocument does
not have (a typo: `max_token`) is refused so too, naming it, as the gRPC port refuses it.
"""
import json
from collections.abc import AsyncIterator
from typing import Any, Optional

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from contract import ServerInfo
from contract.transport import HTTP_STATUS
from gateway.mapping.api_fields import PROMPT_DOCUMENT_FIELDS
from gateway.mapping.inputs import BadRequest, parse_json, prompt_document
from gateway.mapping.protocol import SSE_HEADERS, Parsed, Protocol, Upstream, kind, serve
from schemas import ModelOutputDocument

LIST_FIELDS = ("stop",)  # in a query string: repeated, or one JSON list
END = "event: end\r\n\r\n"


def update(out: ModelOutputDocument) -> str:
    """Byte for byte what Jina's server writes: Jina's client cuts the JSON out at a fixed
    offset after `event: ` and so needs the CRLF line ends."""
    return f"event: update\r\ndata: {json.dumps(out.model_dump(mode='json'))}\r\n\r\n"


async def _fields(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if raw.strip():
        body = parse_json(raw)
        if not isinstance(body, dict):
            raise BadRequest("request body must be a JSON object (a PromptDocument)")
        return body
    fields: dict[str, Any] = dict(request.query_params)
    for name in LIST_FIELDS:  # ?stop=a&stop=b, or ?stop=["a","b"]
        values = request.query_params.getlist(name)
        if len(values) == 1 and values[0].startswith("["):
            values = parse_json(values[0].encode())
        if values:
            fields[name] = values
    return fields


class JinaSSE(Protocol):
    async def parse(self, request: Request, backend: Upstream) -> Parsed:
        fields = await _fields(request)
        PROMPT_DOCUMENT_FIELDS.check_names(fields)  # the document is the request
        return Parsed(prompt_document(**fields), stream=True)

    def refusal(self, error: ModelOutputDocument) -> Response:
        async def body() -> AsyncIterator[str]:
            yield update(error)
            yield END
        return StreamingResponse(body(), status_code=HTTP_STATUS[kind(error)], media_type=self.media_type,
                                 headers=SSE_HEADERS)

    async def events(self, parsed: Parsed, docs: AsyncIterator[ModelOutputDocument],
                     info: Optional[ServerInfo]) -> AsyncIterator[str]:
        async for out in docs:
            yield update(out)
        yield END


def jina_sse_router(backend: Upstream) -> APIRouter:
    router = APIRouter(tags=["Jina"])

    @router.get("/stream", summary="Jina SSE: one `update` event per document, then `end`")
    async def stream(request: Request) -> Response:
        return await serve(JinaSSE(), backend, request)

    return router
