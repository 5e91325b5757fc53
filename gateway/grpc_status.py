"""gRPC status codes for requests refused before their first token.

The executor reports every failure as a final error document (an exception from a
Jina streaming endpoint makes the client retry and repeat tokens). On the gRPC port
the gateway turns a refusal that arrives *first* into a proper status, so plain gRPC
clients see INVALID_ARGUMENT or RESOURCE_EXHAUSTED; failures after tokens were
sent stay error documents at the end of the stream.
"""
from typing import Any, AsyncIterator, Callable, Optional

import grpc
from jina.serve.runtimes.gateway.grpc import GRPCGateway

CODES = {"validation": grpc.StatusCode.INVALID_ARGUMENT,
         "overloaded": grpc.StatusCode.RESOURCE_EXHAUSTED}


def refusal(response: Any) -> Optional[tuple[grpc.StatusCode, str]]:
    """(code, message) when this streamed response is an error document of a mapped type."""
    fields = response.proto.document.data
    if "error_type" not in fields or "error" not in fields:
        return None
    code = CODES.get(fields["error_type"].text)
    return (code, fields["error"].text) if code is not None else None


def with_status(stream_doc: Callable[..., AsyncIterator]) -> Callable[..., AsyncIterator]:
    async def stream_doc_with_status(request: Any, context: Any) -> AsyncIterator:
        first = True
        async for response in stream_doc(request, context):
            if first:
                first = False
                refused = refusal(response)
                if refused is not None:
                    await context.abort(*refused)
            yield response
    return stream_doc_with_status


class StatusGRPCGateway(GRPCGateway):
    """Jina's gRPC gateway, with refusals mapped to status codes."""

    async def setup_server(self) -> None:
        handler = self._request_handler
        handler.stream_doc = with_status(handler.stream_doc)  # the servicer grpc registers
        await super().setup_server()
