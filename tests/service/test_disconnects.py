"""Every way a client can go away, on every protocol, many times over: each disconnect aborts
its generation (the executor's `aborted` count rises by exactly that many, and the batch
empties long before the requests' max_tokens could have been generated).

Then one client at a time leaves a non-streamed request (or a gRPC stream, by its deadline)
at a random moment before the answer, each checked on its own: nothing runs on after it.

LLM_TEST_DISCONNECTS sets how many per protocol (10 here; `make soak` runs 50)."""
import asyncio
import json
import os
import random
import socket
import struct
import time

import grpc
import pytest
import requests
import websockets
from docarray import DocList  # noqa: F401 - jina's protos need docarray loaded first
from jina.proto import jina_pb2_grpc
from jina.types.request.data import SingleDocumentRequest

from gateway.edge.backend import cancel_on_disconnect
from schemas import PromptDocument
from tests.gateway_helpers import busy, stats, wait_until

N = int(os.environ.get("LLM_TEST_DISCONNECTS", "10"))
LONG = 900  # tokens: tens of seconds on the slow model, so only an abort ends a request early


def _first_event_then_leave(method: str, url: str, body: dict) -> None:
    with requests.request(method, url, json=body, stream=True, timeout=60) as r:
        assert r.status_code == 200, r.text
        for line in r.iter_lines(decode_unicode=True):
            if line.startswith("data:") and len(line) > 6:
                break
    # leaving the with-block closes the connection mid-stream


def _raw_http_then_abort(port: int, path: str, body: dict) -> None:
    """A non-streaming request whose client vanishes (RST) while the answer is generated."""
    payload = json.dumps(body).encode()
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
        s.settimeout(0.5)
        try:
            early = s.recv(4096)  # no answer yet: it is being generated
        except TimeoutError:
            pass
        else:
            pytest.fail(f"answered before the client left: {early[:500]!r} (engine: {stats(port)})")
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST


async def _ws(port: int, abort: bool) -> None:
    ws = await websockets.connect(f"ws://127.0.0.1:{port}/chat")
    await ws.send(json.dumps({"prompt": "hello", "max_tokens": LONG, "ignore_eos": True}))
    assert json.loads(await ws.recv())["type"] == "token"
    if abort:
        ws.transport.abort()  # TCP reset, no close frame
    else:
        await ws.close()


def _request() -> SingleDocumentRequest:
    req = SingleDocumentRequest()
    req.data.doc = PromptDocument(prompt="hello", max_tokens=LONG, ignore_eos=True)
    req.header.exec_endpoint = "/stream"
    return req


async def _grpc_cancel(port: int) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = jina_pb2_grpc.JinaSingleDocumentRequestRPCStub(channel).stream_doc(_request())
        await call.read()  # the first token
        call.cancel()


async def _grpc_deadline(port: int) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = jina_pb2_grpc.JinaSingleDocumentRequestRPCStub(channel).stream_doc(_request(), timeout=1.0)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in call:
                pass
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


def _threads(fn, *args) -> list:
    return [asyncio.to_thread(fn, *args) for _ in range(N)]


CASES = {
    "openai-stream-close": lambda g, h: _threads(_first_event_then_leave, "POST", f"http://127.0.0.1:{h}/v1/completions",
                                                 {"prompt": "hello", "max_tokens": LONG, "ignore_eos": True, "stream": True}),
    "tgi-stream-close": lambda g, h: _threads(_first_event_then_leave, "POST", f"http://127.0.0.1:{h}/generate_stream",
                                              {"inputs": "hello", "parameters": {"max_new_tokens": LONG, "ignore_eos": True}}),
    "jina-sse-close": lambda g, h: _threads(_first_event_then_leave, "GET", f"http://127.0.0.1:{h}/stream",
                                            {"prompt": "hello", "max_tokens": LONG, "ignore_eos": True}),
    "openai-unary-tcp-reset": lambda g, h: _threads(_raw_http_then_abort, h, "/v1/completions",
                                                    {"prompt": "hello", "max_tokens": LONG, "ignore_eos": True}),
    "websocket-close": lambda g, h: [_ws(h, abort=False) for _ in range(N)],
    "websocket-tcp-reset": lambda g, h: [_ws(h, abort=True) for _ in range(N)],
    "grpc-cancel": lambda g, h: [_grpc_cancel(g) for _ in range(N)],
    "grpc-deadline": lambda g, h: [_grpc_deadline(g) for _ in range(N)],
}


@pytest.mark.parametrize("case", list(CASES))
async def test_every_disconnect_aborts_its_generation(slow_flow, case):
    grpc_port, http_port = slow_flow
    before = await asyncio.to_thread(stats, http_port)
    assert busy(before) == 0, before
    await asyncio.gather(*CASES[case](grpc_port, http_port))
    after = await asyncio.to_thread(wait_until, http_port, lambda s: busy(s) == 0, 3.0)
    assert busy(after) == 0, f"{case}: generations still running after their clients left: {after}"
    assert after["aborted"] - before["aborted"] == N, (before, after)
    assert after["kv_blocks_used"] == 0 and after["running"] == 0


# ----- one client at a time, leaving at a random moment before the answer -----

LEAVE_AFTER = (0.03, 0.3)  # s after sending: about when the request reaches the engine, or well after
STILL = 0.3  # s without a step: a request still on its way to the engine would have arrived
SETTLE = 10.0  # s at most for an abort to empty the batch (one step: tens of ms, unless the machine is busy)
GREEDY = {"max_tokens": LONG, "ignore_eos": True}  # greedy, and no early end: only an abort stops it


def _post_then_leave(port: int, path: str, body: dict, after: float, how: str) -> None:
    """A non-streamed request whose client leaves `after` s after sending it, before the
    answer: by closing its socket (FIN), resetting it (RST), or by requests' read timeout."""
    if how == "timeout":
        with pytest.raises(requests.exceptions.ReadTimeout):
            requests.post(f"http://127.0.0.1:{port}{path}", json=body, timeout=(10, after))
        return
    payload = json.dumps(body).encode()
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
        s.settimeout(after)
        with pytest.raises(socket.timeout):
            s.recv(1)  # no answer yet
        if how == "reset":
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


async def _grpc_until_deadline(port: int, after: float) -> None:
    req = SingleDocumentRequest()
    req.data.doc = PromptDocument(prompt="hello", **GREEDY)
    req.header.exec_endpoint = "/stream"
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = jina_pb2_grpc.JinaSingleDocumentRequestRPCStub(channel).stream_doc(req, timeout=after)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in call:
                pass
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


HOW = ("close", "reset", "timeout")  # how an HTTP client leaves: FIN, RST, or requests' read timeout
LEAVES = {  # route: (the ways its client leaves, taken in turn; a try)
    "openai-completions": (HOW, lambda g, h, how, after: _post_then_leave(
        h, "/v1/completions", {"prompt": "hello", "temperature": 0, **GREEDY}, after, how)),
    "tgi-generate": (HOW, lambda g, h, how, after: _post_then_leave(
        h, "/generate", {"inputs": "hello", "parameters": {"max_new_tokens": LONG, "ignore_eos": True}}, after, how)),
    "grpc-stream-deadline": (("deadline",), lambda g, h, how, after: asyncio.run(_grpc_until_deadline(g, after))),
}


def _settled(http_port: int) -> dict:
    """/stats once nothing runs and no step was taken for STILL seconds: a request still on
    its way when its client left has mostly arrived (and been aborted) by then."""
    s = wait_until(http_port, lambda s: busy(s) == 0, SETTLE)
    while busy(s) == 0:
        time.sleep(STILL)
        later = wait_until(http_port, lambda s: busy(s) == 0, SETTLE)
        if later["steps"] == s["steps"]:
            return later
        s = later
    return s


@pytest.mark.parametrize("route", list(LEAVES))
def test_each_client_that_leaves_before_the_answer_aborts_its_generation(slow_flow, route):
    """After each client leaves, nothing runs within seconds, and the steps taken since the
    try before are far fewer than a request's max_tokens (which it would need to end on its
    own), so every request that reached the engine was aborted; most did reach it.

    A request may reach the engine a little after its client left (a slow machine), so
    each try's steps and aborts are counted up to the next quiet moment, not tied to it."""
    grpc_port, http_port = slow_flow
    first = last = _settled(http_port)
    assert busy(first) == 0, first
    hows, leave = LEAVES[route]
    for i in range(N):
        how, after = hows[i % len(hows)], random.uniform(*LEAVE_AFTER)
        leave(grpc_port, http_port, how, after)
        now = _settled(http_port)
        steps, aborted = now["steps"] - last["steps"], now["aborted"] - last["aborted"]
        what = f"{route} try {i} ({how} after {after:.3f} s): {steps} steps, {aborted} aborted; {now}"
        assert busy(now) == 0, f"still generating {SETTLE} s after its client (or an earlier one) left: {what}"
        assert steps < LONG // 3, f"a generation ran on after its client left: {what}"
        assert aborted >= 1 or steps == 0, f"steps taken for a request that was not aborted: {what}"
        last = now
    time.sleep(1.0)  # the last request, had it come late
    last = _settled(http_port)
    assert busy(last) == 0, f"{route}: still generating after the last client left: {last}"
    steps, aborted = last["steps"] - first["steps"], last["aborted"] - first["aborted"]
    assert N // 2 <= aborted <= N, f"{route}: {aborted} of {N} requests aborted in the engine ({steps} steps)"
    assert last["kv_blocks_used"] == 0 and last["running"] == 0, last
    assert last["loop_restarts"] == first["loop_restarts"], last


# ----- cancel_on_disconnect itself, in process: every way its watcher can end -----

async def _never() -> dict:
    await asyncio.Event().wait()
    return {}


async def _disconnect() -> dict:
    await asyncio.sleep(0.01)
    return {"type": "http.disconnect"}


async def _fails() -> dict:
    await asyncio.sleep(0.01)
    raise OSError("the transport broke")


async def _cancelled() -> dict:  # the watcher task ends cancelled
    await asyncio.sleep(0.01)
    raise asyncio.CancelledError


def _empty_messages_then_disconnect():
    messages = iter([{"type": "http.request", "body": b"", "more_body": False}] * 2)

    async def receive() -> dict:
        return next(messages, None) or await _disconnect()
    return receive


@pytest.mark.parametrize("receive", [_disconnect, _fails, _cancelled, _empty_messages_then_disconnect()],
                         ids=["disconnect", "receive-fails", "watcher-cancelled", "empty-messages-first"])
async def test_cancel_on_disconnect_cancels_the_request_however_the_watcher_ends(receive):
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def generation() -> str:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "ran to max_tokens"

    call = asyncio.ensure_future(cancel_on_disconnect(receive, generation()))
    await asyncio.wait([call], timeout=2)  # not wait_for: its own cancellation would hide a miss
    assert call.done(), "the request runs on: its generation would go to max_tokens"
    assert call.result() is None and started.is_set() and cancelled.is_set()


async def test_cancel_on_disconnect_answers_or_passes_the_callers_cancellation_on():
    async def answer() -> str:
        await asyncio.sleep(0.01)
        return "done"

    assert await cancel_on_disconnect(_never, answer()) == "done"
    cancelled = asyncio.Event()

    async def generation() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    caller = asyncio.ensure_future(cancel_on_disconnect(_disconnect, generation()))
    await asyncio.sleep(0.05)  # the client left: the caller got None
    assert caller.done() and caller.result() is None and cancelled.is_set()
    cancelled.clear()
    caller = asyncio.ensure_future(cancel_on_disconnect(_never, generation()))
    await asyncio.sleep(0.01)
    caller.cancel()  # the server stops the request: the caller's own cancellation goes on
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert cancelled.is_set()
