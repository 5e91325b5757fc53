"""An executor's answer to Jina's endpoint discovery, computed once, while its model loads.

A Flow's gateway (each of its servers, and the streamers of its router) asks every executor for its
endpoints and their schemas as it starts (Jina's `WorkerRequestHandler.endpoint_discovery`). Jina
computes the answer anew at each call: for every endpoint, the pydantic schemas of its input and
output, and a dynamic model made of each. For this executor's endpoints that is 0.1 to 0.4 s of
its event loop a call, and the four calls at a Flow's start held its first request 0.6 to 0.8 s.
The answer depends on the executor's class alone (its endpoints and their document types): it is
computed once, on a thread started as the executor begins to load its model (a wait for another
process, seconds, while this one is idle), and each call answers a copy.

The same thread imports uvloop, which Jina's first call of an endpoint that is not a coroutine
function (an async generator's, as /stream's, or a plain function's) imports (`get_or_reuse_loop`):
0.1 s of the event loop, which held the first request after every start and reload.

The one place where an executor replaces a part of Jina, written against the Jina that
gateway/edge/jina_patches.py names; tests/unit/test_jina_patches.py checks, with the gateway's
patches, that what it wraps and reads is still there.
"""
import asyncio
import threading
import weakref
from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any, Optional

from jina import Executor
from jina.proto import jina_pb2
from jina.serve.runtimes.worker.request_handling import WorkerRequestHandler

# Jina's own method, also where this module is imported a second time under another name
_jinas_endpoint_discovery = getattr(WorkerRequestHandler.endpoint_discovery, "__wrapped__",
                                    WorkerRequestHandler.endpoint_discovery)
# each executor's answer, serialized (or being computed); it goes with its executor
_answers: "weakref.WeakKeyDictionary[Executor, Future[bytes]]" = weakref.WeakKeyDictionary()


async def _answer(handler: Any) -> bytes:
    """Jina's answer for `handler`'s executor (`handler` needs only `_executor` and `logger`)."""
    return (await _jinas_endpoint_discovery(handler, None, None)).SerializeToString()


def prepare(executor: Executor) -> None:
    """Start computing `executor`'s answer on a thread of its own (call it from `__init__`, once
    Jina's Executor.__init__ has registered the endpoints, before the model's load)."""
    future: Future[bytes] = Future()
    _answers[executor] = future
    handler = SimpleNamespace(_executor=executor, logger=executor.logger)

    def compute() -> None:
        try:
            future.set_result(asyncio.run(_answer(handler)))
        except BaseException as exc:  # noqa: BLE001 - the first call computes it again, and fails as Jina's would
            future.set_exception(exc)
        try:
            import uvloop  # noqa: F401 - imported here, off the first request's path
        except ImportError:  # Jina then warns and goes on without it, as before
            pass
    threading.Thread(target=compute, name="llm-endpoints-answer", daemon=True).start()


async def endpoint_discovery(self: WorkerRequestHandler, empty: Any, context: Any) -> jina_pb2.EndpointsProto:
    """The answer computed ahead (waited for, if it is still being computed), else computed now."""
    future = _answers.get(self._executor)
    answer: Optional[bytes] = None
    try:
        if future is not None:
            answer = await asyncio.wrap_future(future)
    except Exception:  # noqa: BLE001 - computed again below: Jina's error, where it would raise it
        pass
    if answer is None:
        answer = await _answer(self)
        done: Future[bytes] = Future()
        done.set_result(answer)
        _answers[self._executor] = done
    proto = jina_pb2.EndpointsProto()
    proto.ParseFromString(answer)
    return proto


def install() -> None:
    """Idempotent; the executors' modules call it when Jina loads them."""
    setattr(endpoint_discovery, "__wrapped__", _jinas_endpoint_discovery)  # noqa: B010 - a function's attribute
    WorkerRequestHandler.endpoint_discovery = endpoint_discovery
