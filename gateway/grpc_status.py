"""gRPC status codes for requests refused before their first token.

The executor reports every failure as a final error document (an exception from a
Jina streaming endpoint makes the client retry and repeat tokens). On the gRPC port
the gateway turns a refusal that arrives *first* into a proper status, so plain gRPC
clients see INVALID_ARGUMENT or RESOURCE_EXHAUSTED; failures after tokens were
sent stay error documents at the end of the stream.
"""
from collections.abc import AsyncIterator, Callable
from typing import Any, Optional

import grpc
from jina.proto import jina_pb2
from jina.serve.runtimes.gateway.grpc import GRPCGateway

from executors.engine.errors import ErrorKind
from gateway.inputs import LIMITS, LimitError

CODES = {ErrorKind.VALIDATION.value: grpc.StatusCode.INVALID_ARGUMENT,
         ErrorKind.OVERLOADED.value: grpc.StatusCode.RESOURCE_EXHAUSTED}


def refusal(response: Any) -> Optional[tuple[grpc.StatusCode, str]]:
    """(code, message) when this streamed response is an error document of a mapped type."""
    fields = response.proto.document.data
    if "error_type" not in fields or "error" not in fields:
        return None
    code = CODES.get(fields["error_type"].text)
    return (code, fields["error"].text) if code is not None else None


def oversized(request: Any) -> Optional[str]:
    """The request limits, read off the protobuf before anything parses the document (the
    executor's Jina would spend seconds turning a 200,000-entry stop list into Python)."""
    data = request.proto.document.data
    try:
        if "prompt" in data:
            LIMITS.check_prompt(data["prompt"].text)
        if "stop" in data:
            LIMITS.check_stop([node.text for node in data["stop"].list.data])
        if "messages" in data and len(data["messages"].text) > LIMITS.max_body_bytes:
            return f"messages: larger than {LIMITS.max_body_bytes} characters (LLM_MAX_BODY_BYTES)"
    except LimitError as exc:
        return str(exc)
    return None


def with_status(stream_doc: Callable[..., AsyncIterator]) -> Callable[..., AsyncIterator]:
    async def stream_doc_with_status(request: Any, context: Any) -> AsyncIterator:
        too_big = oversized(request)
        if too_big is not None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, too_big)
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
        handler._status = no_status  # Jina's answers with the environment and internal addresses
        # a message past the body limit is refused by gRPC itself (RESOURCE_EXHAUSTED)
        self.grpc_server_options = {**(self.grpc_server_options or {}),
                                    "grpc.max_receive_message_length": LIMITS.max_body_bytes}
        await super().setup_server()


async def no_status(empty: Any, context: Any) -> jina_pb2.JinaInfoProto:
    """JinaInfoRPC/_status, as much as a health check says: it answers."""
    return jina_pb2.JinaInfoProto()
