"""The gateway's calls to the executor end when the request that made them ends.

Jina streams a document from the executor through a chain of async generators around a
gRPC call (jina/serve/networking/connection_stub.py, `send_single_doc_request`). When a
client goes away, the outermost generator is closed or abandoned, but the ones inside it
are not closed: the gRPC call is cancelled only when they are garbage-collected, which a
reference cycle can put off indefinitely. Meanwhile the executor keeps generating into a
batch slot nobody reads.

The replacement below keeps Jina's behaviour and adds two deterministic ends to the call:
`finally` when an exception (a cancellation) runs through it, and a done-callback on the
task that made the call (the HTTP request, the WebSocket answer, the gRPC call of the
client), which fires however that task ends.

It also makes Jina's retries safe. Jina retries a failed call from the start (3 times by
default), which repeats every token already streamed. A failure before the first document
(a connection the executor closed, say) is still retried; one after it is raised as
`StreamBroken`, which Jina's retry loop passes on instead of retrying, and the stream ends
with one error.
"""
import asyncio
from collections.abc import AsyncIterator
from typing import Any, Optional

import grpc
from jina.serve.networking.connection_stub import _ConnectionStubs


class StreamBroken(RuntimeError):
    """The executor's stream failed after its first document: not to be retried."""


async def send_single_doc_request(self: _ConnectionStubs, request: Any, metadata: Any, compression: Any,
                                  timeout: Optional[float] = None) -> AsyncIterator[tuple[Any, None]]:
    if not self._initialized:
        await self._init_stubs()
    if not self.stream_doc_stub:
        raise ValueError("Can not send SingleDocumentRequest. gRPC endpoint not available.")
    self._record_request_bytes_metric(request.nbytes)
    call = self.stream_doc_stub.stream_doc(request, compression=compression, timeout=timeout,
                                           metadata=metadata)
    task = asyncio.current_task()
    if task is not None:
        task.add_done_callback(lambda _: call.cancel())
    streamed = False
    try:
        with self._get_metric_timer():
            async for response in call:
                self._record_received_bytes_metric(response.nbytes)
                streamed = True
                yield response, None
    except grpc.aio.AioRpcError as exc:
        if not streamed:
            raise  # nothing was sent on yet: Jina may retry
        raise StreamBroken(f"the executor's stream broke after its first document: "
                           f"{exc.code().name}: {exc.details()}") from None
    finally:
        call.cancel()  # no-op once the call has ended


def install() -> None:
    """Idempotent; the gateway's module calls it when Jina loads it."""
    _ConnectionStubs.send_single_doc_request = send_single_doc_request
