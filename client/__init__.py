"""Async helper over Jina's `Client.stream_doc`: tokens as they arrive, errors as exceptions."""
import json
import warnings
from typing import Any, AsyncIterator, Optional

from pydantic import ValidationError

# jina imports pkg_resources (through jina-hubble-sdk), which warns on every start
warnings.filterwarnings("ignore", message="pkg_resources is deprecated", category=UserWarning)

from jina import Client  # noqa: E402
from jina.excepts import BadServerFlow  # noqa: E402

from schemas import ModelOutputDocument, PromptDocument


class StreamError(RuntimeError):
    """The server ended the stream with an error document."""

    def __init__(self, message: str, error_type: str | None, generated_text: str = ""):
        super().__init__(f"{error_type or 'error'}: {message}")
        self.error_type = error_type
        self.generated_text = generated_text


def make_client(host: str = "localhost", port: int = 12345, protocol: str = "grpc") -> Any:
    """An asyncio Jina client (`Client` is a factory function, hence `Any`)."""
    return Client(host=host, port=port, protocol=protocol, asyncio=True)


async def stream(prompt: str, *, host: str = "localhost", port: int = 12345, protocol: str = "grpc",
                 client: Optional[Any] = None, **sampling) -> AsyncIterator[ModelOutputDocument]:
    """Yield one ModelOutputDocument per streamed step; raise StreamError on a failure.

    `sampling` takes PromptDocument's fields: max_tokens, do_sample, temperature,
    top_k, top_p, typical_p, repetition_penalty, seed, stop, and `messages` (a list of
    {role, content}, rendered with the model's chat template; it replaces `prompt`).
    """
    client = client or make_client(host, port, protocol)
    doc = _document(prompt, sampling)
    finished = False
    try:
        async for out in client.stream_doc(on="/stream", inputs=doc, return_type=ModelOutputDocument):
            if out.error is not None:
                raise StreamError(out.error, out.error_type, out.generated_text)
            finished = out.finish_reason is not None
            yield out
    except BadServerFlow as exc:  # the Flow's gateway refused with a gRPC status
        raise _from_status(exc) from exc
    if not finished:
        raise StreamError("the stream ended before its final document", "truncated")


def _document(prompt: str, fields: dict[str, Any]) -> PromptDocument:
    if isinstance(fields.get("messages"), list):
        fields = {**fields, "messages": json.dumps(fields["messages"])}
    try:
        return PromptDocument(prompt=prompt, **fields)
    except ValidationError as exc:  # a value the document cannot carry, named like the server does
        first = exc.errors()[0]
        raise StreamError(f"{first['loc'][0]}: {first['msg'].removeprefix('Value error, ')}",
                          "validation") from None


_STATUS_TYPES = {"INVALID_ARGUMENT": "validation", "RESOURCE_EXHAUSTED": "overloaded"}


def _from_status(exc: BadServerFlow) -> Exception:
    rpc_error = exc.__cause__
    if rpc_error is None or not hasattr(rpc_error, "code"):
        return exc
    error_type = _STATUS_TYPES.get(rpc_error.code().name)
    return StreamError(rpc_error.details(), error_type) if error_type else exc


async def generate(prompt: str, **kwargs) -> ModelOutputDocument:
    """Collect a whole stream; the returned document is the last one, with generated_text."""
    last = None
    async for last in stream(prompt, **kwargs):
        pass
    return last


__all__ = ["StreamError", "generate", "make_client", "stream"]
