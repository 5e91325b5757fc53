"""The gRPC port's edge, where callers in other languages meet the service.

Before anything parses a request (DocArray would coerce "4" into 4, or fail inside the
executor's Jina and answer OK with no document), the gateway checks it against
PromptDocument's fields, as derived from the schema:
  - a field of the wrong kind, an unknown field, or `parameters` (the options live in the
    document) are INVALID_ARGUMENT naming the field; so are values the document refuses;
  - /stream streams; a unary endpoint called as a stream is INVALID_ARGUMENT, an unknown or
    missing one UNIMPLEMENTED;
  - the unary /generate (process_single_data, and JinaRPC/Call's requests) has each of its
    documents checked so, the call ended INVALID_ARGUMENT at the first that is wrong;
  - a refusal before the first token is a status (INVALID_ARGUMENT, RESOURCE_EXHAUSTED); a
    failure after it, an error document; every response echoes the request's request_id.
Standard services: grpc.health.v1 answers SERVING for the server as a whole (Kubernetes'
gRPC probes ask for ""), reflection v1 answers beside Jina's v1alpha, and JinaInfoRPC's
_status no longer tells anyone the environment.
"""
import typing
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Optional

import grpc
from docarray.proto import DocListProto
from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection, reflection_pb2
from jina.proto import jina_pb2
from jina.serve.runtimes.gateway.grpc import GRPCGateway
from pydantic import ValidationError

from contract.transport import GRPC_STATUS, error_kind
from gateway.edge import jina_patches
from gateway.edge.http_guard import api_key, key_matches
from gateway.fleet.channels import PING_POLICY
from gateway.mapping.api_fields import PROMPT_DOCUMENT_FIELDS
from gateway.mapping.inputs import LIMITS, BadRequest, LimitError, bad_request
from schemas import PromptDocument, Seed

# the NodeProto kinds each Python type accepts; subclasses first (Seed is an int, bool too)
NODE_KINDS_OF_TYPE = ((Seed, {"integer", "text"}), (bool, {"boolean"}), (int, {"integer"}), (float, {"float", "integer"}),
         (str, {"text"}), (list, {"list"}))
NODE_KIND_WORDS = {"text": "a string (text)", "boolean": "a boolean (boolean)", "integer": "an integer (integer)",
         "float": "a number (float)", "list": "a list (list)"}
LIST_ITEM_WORDS = {"text": "strings (text)", "integer": "integers (integer)"}
REFLECTION_V1 = "grpc.reflection.v1.ServerReflection"


@dataclass(frozen=True)
class FieldKinds:
    """The NodeProto kinds a field accepts, whether it may be null (left unset), and for a list
    the kind of its items."""
    kinds: set[str]
    optional: bool
    item: Optional[str] = None


def _bare(annotation: Any) -> tuple[Any, bool]:
    optional = typing.get_origin(annotation) is typing.Union
    if optional:
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation, optional


def _kinds_of(annotation: Any) -> set[str]:
    base = typing.get_origin(annotation) or annotation
    return next(kinds for cls, kinds in NODE_KINDS_OF_TYPE if issubclass(base, cls))


def _field_kinds(annotation: Any) -> FieldKinds:
    annotation, optional = _bare(annotation)
    kinds = _kinds_of(annotation)
    if kinds != {"list"}:
        return FieldKinds(kinds, optional)
    item = _kinds_of(_bare(typing.get_args(annotation)[0])[0])
    return FieldKinds(kinds, optional, "integer" if "integer" in item else "text")


PROMPT_FIELD_KINDS = {name: _field_kinds(info.annotation) for name, info in PromptDocument.model_fields.items()}


def wrong_field(document: Any) -> Optional[str]:
    """The first field a caller got wrong, as a message naming it; None when all are right. A
    field the document does not have is refused as every HTTP route refuses it."""
    try:
        PROMPT_DOCUMENT_FIELDS.check_names(document.data.keys())
    except BadRequest as exc:
        return str(exc)
    for name, node in document.data.items():
        expected = PROMPT_FIELD_KINDS[name]
        kind = node.WhichOneof("content")
        if kind is None:
            if not expected.optional:
                return f"{name}: null; leave the field out for its default"
        elif kind not in expected.kinds:
            return f"{name}: expected {' or '.join(NODE_KIND_WORDS[k] for k in sorted(expected.kinds))}, got {kind}"
        elif kind == "list" and any(item.WhichOneof("content") != expected.item for item in node.list.data):
            return f"{name}: expected a list of {LIST_ITEM_WORDS[expected.item or 'text']}"
    try:
        PromptDocument.from_protobuf(document)
    except (ValidationError, ValueError) as exc:
        return str(bad_request(exc)) if isinstance(exc, ValidationError) else str(exc)
    return None


def oversized(document: Any) -> Optional[str]:
    """The request limits, read off the protobuf before anything parses the document (the
    executor's Jina would spend seconds turning a 200,000-entry stop list into Python)."""
    data = document.data
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


def wrong_endpoint(endpoint: str, streaming: dict[str, bool]) -> Optional[tuple[grpc.StatusCode, str]]:
    """`streaming`: the executor's endpoints, whether each streams (empty: not known yet)."""
    if not endpoint or (streaming and endpoint not in streaming):
        served = ", ".join(sorted(streaming)) or "/stream"
        return grpc.StatusCode.UNIMPLEMENTED, f"header.exec_endpoint: {endpoint!r} is not served; it serves {served}"
    if streaming and not streaming[endpoint]:
        return grpc.StatusCode.INVALID_ARGUMENT, (
            f"header.exec_endpoint: {endpoint} is unary: call JinaSingleDataRequestRPC/process_single_data "
            f"(or JinaRPC/Call); stream_doc streams from /stream")
    return None


def refusal(request: Any, streaming: dict[str, bool]) -> Optional[tuple[grpc.StatusCode, str]]:
    """Why a stream_doc request is refused before it reaches the executor, if it is."""
    proto = request.proto
    wrong = wrong_endpoint(proto.header.exec_endpoint, streaming)
    if wrong is not None:
        return wrong
    if proto.HasField("parameters") and proto.parameters.fields:
        return grpc.StatusCode.INVALID_ARGUMENT, (
            "parameters: not used on /stream; set the options as fields of the document (PromptDocument)")
    message = oversized(proto.document) or wrong_field(proto.document)
    return (grpc.StatusCode.INVALID_ARGUMENT, message) if message else None


def data_refusal(proto: Any) -> Optional[tuple[grpc.StatusCode, str]]:
    """Why a DataRequest for the unary /generate is refused before it reaches the executor, if it
    is: its prompt documents, each as stream_doc's (the executor's DocArray would drop an unknown
    field, and run a typo with the default)."""
    if proto.header.exec_endpoint != "/generate":
        return None
    content = proto.data
    try:
        docs = (content.docs if content.WhichOneof("documents") != "docs_bytes"
                else DocListProto.FromString(content.docs_bytes)).docs
    except DecodeError:
        return None  # DocArray's other encodings: the executor reads (or refuses) them
    for document in docs:
        message = oversized(document) or wrong_field(document)
        if message:
            return grpc.StatusCode.INVALID_ARGUMENT, message
    return None


def checked_data(process_single_data: Callable[..., Any], stream: Callable[..., AsyncIterator]
                 ) -> tuple[Callable[..., Any], Callable[..., AsyncIterator]]:
    """process_single_data and JinaRPC/Call (`stream`), their /generate requests checked first."""
    async def process_single_data_at_the_edge(request: Any, context: Any) -> Any:
        refused = data_refusal(request.proto_with_data)
        if refused is not None:
            await context.abort(*refused)
        return await process_single_data(request, context)

    async def stream_at_the_edge(request_iterator: Any, context: Any, *args: Any, **kwargs: Any) -> AsyncIterator:
        async def checked() -> AsyncIterator:
            async for request in request_iterator:
                refused = data_refusal(request.proto_with_data)
                if refused is not None:
                    await context.abort(*refused)
                yield request
        async for response in stream(checked(), context, *args, **kwargs):
            yield response
    return process_single_data_at_the_edge, stream_at_the_edge


def error_status(response: Any) -> Optional[tuple[grpc.StatusCode, str]]:
    """(code, message) when this streamed response is an error document of a mapped kind."""
    fields = response.proto.document.data
    if "error_type" not in fields or "error" not in fields:
        return None
    code = GRPC_STATUS[error_kind(fields["error_type"].text)]
    return (grpc.StatusCode[code], fields["error"].text) if code is not None else None


def checked_at_the_edge(stream_doc: Callable[..., AsyncIterator], streaming: Callable[[], dict[str, bool]]
            ) -> Callable[..., AsyncIterator]:
    async def stream_doc_at_the_edge(request: Any, context: Any) -> AsyncIterator:
        refused = refusal(request, streaming())
        if refused is not None:
            await context.abort(*refused)
        request_id, first = request.proto.header.request_id, True
        async for response in stream_doc(request, context):
            if first:
                first = False
                failed = error_status(response)
                if failed is not None:
                    await context.abort(*failed)
            if request_id:
                response.proto.header.request_id = request_id
            yield response
    return stream_doc_at_the_edge


class ApiKeyInterceptor(grpc.aio.ServerInterceptor):
    """With LLM_API_KEY set, every call but health and reflection needs the `authorization:
    Bearer <key>` metadata; others end UNAUTHENTICATED before their handler runs."""

    OPEN = ("/grpc.health.v1.Health/", "/grpc.reflection.")

    def __init__(self, key: str):
        self.key = key

    async def intercept_service(self, continuation: Any, details: Any) -> Any:
        handler = await continuation(details)
        metadata = dict(details.invocation_metadata or ())
        if handler is None or details.method.startswith(self.OPEN) or key_matches(metadata.get("authorization"),
                                                                                   self.key):
            return handler

        async def deny(request: Any, context: Any) -> None:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "authorization: a valid API key is required "
                                                                 "(metadata authorization: Bearer <key>)")

        async def deny_stream(request: Any, context: Any) -> AsyncIterator:
            await deny(request, context)
            yield  # an async generator, as a streaming handler must be

        kind = ("unary_unary" if handler.unary_unary else "unary_stream" if handler.unary_stream
                else "stream_unary" if handler.stream_unary else "stream_stream")
        return handler._replace(**{kind: deny_stream if kind.endswith("stream") else deny})


class StatusGRPCGateway(GRPCGateway):
    """Jina's gRPC gateway, with the edge above."""

    async def setup_server(self) -> None:
        # the servicer grpc registers, checked at the edge; Jina's _status, which tells the environment, gone
        jina_patches.wrap_grpc_servicer(self, checked_at_the_edge, checked_data)
        # a message past the body limit is refused by gRPC itself (RESOURCE_EXHAUSTED); Jina clients'
        # keepalive pings are allowed (gateway/fleet/channels.py)
        self.grpc_server_options: Optional[dict[str, Any]] = {
            **PING_POLICY, **(self.grpc_server_options or {}), "grpc.max_receive_message_length": LIMITS.max_body_bytes}
        if api_key():
            self.grpc_tracing_server_interceptors: Optional[list[Any]] = [
                *(self.grpc_tracing_server_interceptors or []), ApiKeyInterceptor(api_key())]
        await super().setup_server()
        await self.health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        self.server.add_generic_rpc_handlers([_reflection_v1()])


def _reflection_v1() -> grpc.GenericRpcHandler:
    """Reflection v1 speaks v1alpha's messages under another service name: serve it with
    grpcio-reflection's v1alpha servicer (this grpcio has no v1 module)."""
    names = [s.full_name for s in jina_pb2.DESCRIPTOR.services_by_name.values()] + [
        health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, REFLECTION_V1, reflection.SERVICE_NAME]
    servicer = reflection.ReflectionServicer(names)
    return grpc.method_handlers_generic_handler(REFLECTION_V1, {"ServerReflectionInfo": grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo, request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString)})

