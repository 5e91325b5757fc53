"""Every way a client can go away, on every protocol, many times over: each disconnect aborts
its generation (the executor's `aborted` count rises by exactly that many, and the batch
empties long before the requests' max_tokens could have been generated).

LLM_TEST_DISCONNECTS sets how many per protocol (10 here; `make soak` runs 50)."""
import asyncio
import json
import os
import socket
import struct

import grpc
import pytest
import requests
import websockets
from docarray import DocList  # noqa: F401 - jina's protos need docarray loaded first
from jina.proto import jina_pb2_grpc
from jina.types.request.data import SingleDocumentRequest

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
        with pytest.raises(socket.timeout):
            s.recv(1)  # no answer yet: it is being generated
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST


async def _ws(port: int, abort: bool) -> None:
    ws = await websockets.connect(f"ws://127.0.0.1:{port}/chat")
    await ws.send(json.dumps({"prompt": "hello", "max_tokens": LONG}))
    assert json.loads(await ws.recv())["type"] == "token"
    if abort:
        ws.transport.abort()  # TCP reset, no close frame
    else:
        await ws.close()


def _request() -> SingleDocumentRequest:
    req = SingleDocumentRequest()
    req.data.doc = PromptDocument(prompt="hello", max_tokens=LONG)
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
                                                 {"prompt": "hello", "max_tokens": LONG, "stream": True}),
    "tgi-stream-close": lambda g, h: _threads(_first_event_then_leave, "POST", f"http://127.0.0.1:{h}/generate_stream",
                                              {"inputs": "hello", "parameters": {"max_new_tokens": LONG}}),
    "jina-sse-close": lambda g, h: _threads(_first_event_then_leave, "GET", f"http://127.0.0.1:{h}/stream",
                                            {"prompt": "hello", "max_tokens": LONG}),
    "openai-unary-tcp-reset": lambda g, h: _threads(_raw_http_then_abort, h, "/v1/completions",
                                                    {"prompt": "hello", "max_tokens": LONG}),
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
    assert after["reserved_tokens"] == 0 and after["batch_rows"] == 0
