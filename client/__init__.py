"""Async helper over Jina's `Client.stream_doc`: tokens as they arrive, errors as exceptions."""
import contextlib
import json
import warnings
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, Optional

from pydantic import ValidationError

# jina imports pkg_resources (through jina-hubble-sdk), which warns on every start
warnings.filterwarnings("ignore", message="pkg_resources is deprecated", category=UserWarning)

import aiohttp  # noqa: E402
import grpc  # noqa: E402
from jina import Client  # noqa: E402
from jina.excepts import BadServerFlow  # noqa: E402
from jina.proto.jina_pb2_grpc import JinaSingleDocumentRequestRPCStub  # noqa: E402
from jina.types.request.data import SingleDocumentRequest  # noqa: E402

from contract import ErrorKind, settings  # noqa: E402
from schemas import ModelOutputDocument, PromptDocument, named_error


class StreamError(RuntimeError):
    """The server ended the stream with an error document."""

    def __init__(self, message: str, error_type: str | None, generated_text: str = ""):
        super().__init__(f"{error_type or 'error'}: {message}")
        self.error_type = error_type
        self.generated_text = generated_text


def default_port(protocol: str = "grpc") -> int:
    """The port `make serve` listens on for `protocol` ("grpc", else HTTP): the variable the
    server reads ($LLM_GRPC_PORT, $LLM_HTTP_PORT), else its default (12345, 12346)."""
    port: int = settings.read("LLM_GRPC_PORT" if protocol == "grpc" else "LLM_HTTP_PORT")
    return port


def make_client(host: str = "localhost", port: Optional[int] = None, protocol: str = "grpc") -> Any:
    """An asyncio Jina client (`Client` is a factory function, hence `Any`); port: default_port."""
    return Client(host=host, port=port or default_port(protocol), protocol=protocol, asyncio=True)


def connect(host: str = "localhost", port: Optional[int] = None) -> grpc.aio.Channel:
    """A gRPC channel for many `stream(..., channel=...)` calls, as an HTTP client keeps its
    connection: each call then skips a new connection (the benchmark's time to first token on
    the tiny model: 4 to 5 ms instead of 8 to 10). Use it as `async with connect(...) as
    channel:`, on the event loop that makes the calls. port: default_port."""
    return grpc.aio.insecure_channel(f"{host}:{port or default_port()}")


async def stream(prompt: str, *, host: str = "localhost", port: Optional[int] = None, protocol: str = "grpc",
                 client: Optional[Any] = None, channel: Optional[grpc.aio.Channel] = None,
                 api_key: Optional[str] = None, **sampling) -> AsyncIterator[ModelOutputDocument]:
    """Yield one ModelOutputDocument per streamed step; raise StreamError on a failure.

    `sampling` takes PromptDocument's fields: max_tokens, do_sample, temperature,
    top_k, top_p, typical_p, repetition_penalty, seed, stop, and `messages` (a list of
    {role, content}, rendered with the model's chat template; it replaces `prompt`).
    Without a `client` (a Jina Client), the call is made directly: on Jina's gRPC stub, or
    on the SSE route, so that leaving the loop cancels it at once (Jina's client leaves that
    to the garbage collector), and `api_key` (default: $LLM_API_KEY) can go with it. The gRPC
    call goes over `channel` when given (`connect`), else over a channel of its own; `port`:
    default_port(protocol), where `make serve` listens.
    """
    if channel is not None and (client is not None or protocol != "grpc"):
        raise ValueError("channel: a gRPC channel from connect(), for protocol='grpc' without a client")
    doc = _document(prompt, sampling)
    key = api_key if api_key is not None else settings.read("LLM_API_KEY")
    port = port or default_port(protocol)
    if client is None and protocol == "grpc":
        docs = _grpc_stream(doc, channel, host, port, key)
    elif client is None:
        docs = _http_stream(doc, host, port, key)
    else:
        docs = client.stream_doc(on="/stream", inputs=doc, return_type=ModelOutputDocument)
    finished = False
    try:
        async for out in docs:
            if out.error is not None:
                raise StreamError(out.error, out.error_type, out.generated_text)
            finished = out.finish_reason is not None
            yield out
    except BadServerFlow as exc:  # the Flow's gateway refused with a gRPC status
        raise _from_status(exc) from exc
    finally:
        await docs.aclose()
    if not finished:
        raise StreamError("the stream ended before its final document", "truncated")


async def _grpc_stream(doc: PromptDocument, channel: Optional[grpc.aio.Channel], host: str, port: int,
                       key: str) -> AsyncGenerator[ModelOutputDocument, None]:
    request = SingleDocumentRequest()
    request.header.exec_endpoint = "/stream"
    request.document_cls = PromptDocument
    request.data.doc = doc
    metadata = (("authorization", f"Bearer {key}"),) if key else None
    async with contextlib.AsyncExitStack() as own:
        if channel is None:
            channel = await own.enter_async_context(connect(host, port))
        call = JinaSingleDocumentRequestRPCStub(channel).stream_doc(request, metadata=metadata)
        try:
            async for response in call:
                yield ModelOutputDocument.from_protobuf(response.document)
        except grpc.aio.AioRpcError as exc:
            raise _from_rpc_error(exc) from None
        finally:
            call.cancel()  # a no-op when it ended; else the server stops generating now


async def _http_stream(doc: PromptDocument, host: str, port: int,
                       key: str) -> AsyncGenerator[ModelOutputDocument, None]:
    """Jina's SSE wire format on GET /stream: `event: update` / `data: {document}` lines."""
    headers = {"Accept": "text/event-stream", **({"Authorization": f"Bearer {key}"} if key else {})}
    timeout = aiohttp.ClientTimeout(total=None, sock_read=600)
    async with aiohttp.ClientSession(timeout=timeout) as session, session.get(
            f"http://{host}:{port}/stream", data=doc.model_dump_json(), headers=headers) as response:
        if response.content_type == "application/json":  # refused before the stream (401, 413)
            body = (await response.json())["error"]
            raise StreamError(body if isinstance(body, str) else body["message"],
                              (ErrorKind.AUTHENTICATION if response.status == 401 else ErrorKind.VALIDATION).value)
        async for line in response.content:
            if line.startswith(b"data: {"):
                yield ModelOutputDocument.model_validate_json(line[len(b"data: "):])


def _document(prompt: str, fields: dict[str, Any]) -> PromptDocument:
    if isinstance(fields.get("messages"), list):
        fields = {**fields, "messages": json.dumps(fields["messages"])}
    try:
        return PromptDocument(prompt=prompt, **fields)
    except ValidationError as exc:  # a value the document cannot carry, named like the server does
        raise StreamError(named_error(exc)[1], "validation") from None


_STATUS_TYPES = {"INVALID_ARGUMENT": "validation", "RESOURCE_EXHAUSTED": "overloaded"}


def _from_status(exc: BadServerFlow) -> Exception:
    rpc_error = exc.__cause__
    if rpc_error is None or not hasattr(rpc_error, "code"):
        return exc
    return _from_rpc_error(rpc_error)


def _from_rpc_error(rpc_error: Any) -> StreamError:
    """Refusals before the first token are gRPC statuses; the rest say what went wrong."""
    code, details = rpc_error.code(), rpc_error.details() or ""
    if "larger than max" in details:  # gRPC's own size limit: the request, not the load
        return StreamError(f"body: {details} (the server's LLM_MAX_BODY_BYTES)", "validation")
    return StreamError(details or code.name, _STATUS_TYPES.get(code.name, code.name.lower()))


async def generate(prompt: str, **kwargs) -> ModelOutputDocument:
    """A whole answer as one document: `text` is all of it (and `reasoning` all of a reasoning
    model's thoughts), every per-token list (token_ids,
    logprobs, texts, alternatives, tool-call parts, the prompt's log probabilities) holds the
    whole answer's, and the rest (finish_reason, generated_tokens, seed...) is the last
    document's. With `n` above 1, the answer that ended last."""
    docs = [doc async for doc in stream(prompt, **kwargs)]
    assert docs  # stream raises StreamError rather than end without a final document
    last = docs[-1]
    own = [doc for doc in docs if doc.choice_index == last.choice_index]
    joined = {name: [item for doc in own for item in getattr(doc, name)]
              for name, value in last if isinstance(value, list)}
    return last.model_copy(update={**joined, "text": "".join(doc.text for doc in own),
                                   "reasoning": "".join(doc.reasoning for doc in own)})


__all__ = ["StreamError", "connect", "default_port", "generate", "make_client", "stream"]
