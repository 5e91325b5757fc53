"""Cancellation, overload and failure on every gateway route, and the browser page's stop button.

A Flow of its own: a slow model (about 20 ms per token, so a 900-token request would run
15 s or more) and small limits (2 running, 1 waiting). "Cancelled" means the executor's
/stats shows the slot free within a few seconds of the client going away.
"""
import asyncio
import json
import signal
import threading

import openai
import psutil
import pytest
import requests
import websockets

from client import StreamError, generate
from testing.flows import start_flow
from tests.gateway_helpers import (
    busy,
    chat_page,
    engine_processes,
    executor_process,
    needs_chromium,
    set_fields,
    sse_data,
    stats,
    wait_until,
)

LONG = 900


@pytest.fixture(scope="module")
def limited_flow(slow_model, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("limited")
    server, grpc_port, http_port = start_flow(slow_model, tmp, max_running=2, max_waiting=1)
    yield server, http_port, grpc_port
    server.stop()


def base(http_port: int) -> str:
    return f"http://127.0.0.1:{http_port}"


def assert_freed(http_port: int, aborted_before: int, n: int = 1) -> None:
    """The slot is free again because `n` generations were aborted (not because they ended)."""
    s = wait_until(http_port, lambda s: busy(s) == 0, timeout=8.0)
    assert busy(s) == 0, f"the generation was not cancelled: {s}"
    assert s["aborted"] == aborted_before + n, s


def aborted(http_port: int) -> int:
    return stats(http_port)["aborted"]


def _read_then_leave(method: str, url: str, body: dict, events: int = 2) -> None:
    with requests.request(method, url, json=body if method == "POST" else None,
                          params=body if method == "GET" else None, stream=True, timeout=60) as r:
        assert r.status_code == 200, r.text
        seen = 0
        for line in r.iter_lines(decode_unicode=True):
            seen += line.startswith("data:")
            if seen >= events:
                break
    # leaving the with-block closes the connection mid-stream


# every request runs to LONG tokens unless cancelled: sampled from the random model, one may
# otherwise draw its end-of-sequence token early and be answered before the client leaves
STREAMS = {
    "jina_sse": ("GET", "/stream", {"prompt": "hello", "max_tokens": LONG, "ignore_eos": True}),
    "tgi_generate_stream": ("POST", "/generate_stream",
                            {"inputs": "hello", "parameters": {"max_new_tokens": LONG, "ignore_eos": True}}),
    "tgi_root_stream": ("POST", "/", {"inputs": "hello", "stream": True,
                                      "parameters": {"max_new_tokens": LONG, "ignore_eos": True}}),
    "openai_completions": ("POST", "/v1/completions",
                           {"prompt": "hello", "max_tokens": LONG, "ignore_eos": True, "stream": True}),
    "openai_chat": ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                    "max_tokens": LONG, "ignore_eos": True, "stream": True}),
}


@pytest.mark.parametrize("route", list(STREAMS))
def test_stream_disconnect_cancels_generation(limited_flow, route):
    _, http_port, _ = limited_flow
    method, path, body = STREAMS[route]
    before = aborted(http_port)
    _read_then_leave(method, base(http_port) + path, body)
    assert_freed(http_port, before)


UNARY = {
    "tgi_generate": ("/generate", {"inputs": "hello", "parameters": {"max_new_tokens": LONG, "ignore_eos": True}}),
    "openai_completions": ("/v1/completions", {"prompt": "hello", "max_tokens": LONG, "ignore_eos": True}),
}


@pytest.mark.parametrize("route", list(UNARY))
def test_non_stream_disconnect_cancels_generation(limited_flow, route):
    _, http_port, _ = limited_flow
    path, body = UNARY[route]
    before = aborted(http_port)
    try:
        r = requests.post(base(http_port) + path, json=body, timeout=2.0)
    except requests.exceptions.ReadTimeout:
        pass  # the client left while the generation ran
    else:
        pytest.fail(f"answered before the client left: {r.status_code} {r.text[:500]} (engine: {stats(http_port)})")
    assert_freed(http_port, before)


async def test_websocket_stop_and_close_cancel(limited_flow):
    _, http_port, _ = limited_flow
    before = aborted(http_port)
    async with websockets.connect(f"ws://127.0.0.1:{http_port}/chat") as ws:
        await ws.send(json.dumps({"prompt": "hello", "max_tokens": LONG, "ignore_eos": True}))
        assert json.loads(await ws.recv())["type"] == "token"
        await ws.send(json.dumps({"type": "stop"}))
        while (event := json.loads(await ws.recv()))["type"] == "token":
            pass
        assert event["type"] == "end" and event["finish_reason"] == "cancelled"
        assert 0 < event["generated_tokens"] < LONG
        assert_freed(http_port, before)
        # the connection stays usable, the stopped turn is part of the conversation
        await ws.send(json.dumps({"prompt": "again", "max_tokens": 2}))
        while (event := json.loads(await ws.recv()))["type"] == "token":
            pass
        assert event["finish_reason"] == "length" and event["generated_tokens"] == 2
        await ws.send(json.dumps({"prompt": "and a long one", "max_tokens": LONG, "ignore_eos": True}))
        assert json.loads(await ws.recv())["type"] == "token"
    assert_freed(http_port, before, 2)  # closing the socket cancelled it


def test_overload_is_429_everywhere(limited_flow):
    _, http_port, _ = limited_flow
    url = base(http_port)
    before = aborted(http_port)
    done = threading.Event()
    statuses: list[int] = []

    def hold() -> None:  # a long stream, open until the test ends
        r = requests.post(f"{url}/generate_stream", json={"inputs": "hold", "parameters": {
            "max_new_tokens": LONG, "ignore_eos": True}}, stream=True, timeout=60)
        statuses.append(r.status_code)
        done.wait(60)
        r.close()

    holders = [threading.Thread(target=hold) for _ in range(3)]  # 2 running + 1 waiting
    try:
        for n, h in enumerate(holders, 1):  # one by one, each admitted before the next: a
            h.start()                         # request still queued would make the next one 429
            s = wait_until(http_port, lambda s, n=n: (s["running"], s["waiting"]) == (min(n, 2), n // 3))
        assert (s["running"], s["waiting"]) == (2, 1), (s, statuses)
        r = requests.post(f"{url}/generate", json={"inputs": "x", "parameters": {"max_new_tokens": 2}})
        assert r.status_code == 429 and r.json()["error_type"] == "overloaded"
        r = requests.post(f"{url}/generate_stream", json={"inputs": "x"})
        assert r.status_code == 429 and r.json()["error_type"] == "overloaded"
        oai = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.RateLimitError) as err:
            oai.completions.create(model="slow", prompt="x", max_tokens=2, stream=True)
        assert err.value.body["code"] == "overloaded"

        async def ws_try() -> dict:
            async with websockets.connect(f"ws://127.0.0.1:{http_port}/chat") as ws:
                await ws.send("x")
                return json.loads(await ws.recv())
        event = asyncio.run(ws_try())
        assert event["type"] == "error" and event["error_type"] == "overloaded"
        assert asyncio.run(grpc_status_of(limited_flow[2])) == "RESOURCE_EXHAUSTED"
    finally:
        done.set()
        for h in holders:
            h.join(60)
    assert_freed(http_port, before, 3)


async def grpc_status_of(grpc_port: int, **kw) -> str:
    """The gRPC status a plain Jina client gets for a request refused before its first token."""
    from jina import Client
    from jina.excepts import BadServerFlow

    from schemas import ModelOutputDocument, PromptDocument
    client = Client(port=grpc_port, protocol="grpc", asyncio=True)
    try:
        async for _ in client.stream_doc(on="/stream", inputs=PromptDocument(prompt="x", **kw),
                                         return_type=ModelOutputDocument):
            pass
    except BadServerFlow as exc:
        return exc.__cause__.code().name
    return "OK"


async def test_grpc_refusals_are_status_codes(limited_flow):
    grpc_port = limited_flow[2]
    assert await grpc_status_of(grpc_port, max_tokens=0) == "INVALID_ARGUMENT"
    with pytest.raises(StreamError) as err:  # the client helper maps it back
        await generate("x", port=grpc_port, top_p=5.0, do_sample=True)
    assert err.value.error_type == "validation" and "top_p" in str(err.value)


@needs_chromium
def test_browser_page_streams_and_stops(limited_flow):
    from playwright.sync_api import expect
    _, http_port, _ = limited_flow
    before = aborted(http_port)
    with chat_page(f"{base(http_port)}/chat-ui") as page:
        set_fields(page, max_tokens=LONG)
        page.fill("#prompt", "tell me a long story")
        page.click("#send")
        answer = page.locator(".message.assistant").last
        page.wait_for_function("() => document.querySelector('.message.assistant:last-child')?.dataset.text",
                               timeout=15000)  # tokens arrive...
        expect(page.locator("body")).to_have_attribute("data-state", "generating")  # ...before the end
        assert busy(stats(http_port)) == 1
        page.click("#stop")
        expect(page.locator("body")).to_have_attribute("data-state", "idle", timeout=10000)
        expect(answer).to_have_attribute("data-finish", "cancelled")
        expect(page.locator("#status")).to_contain_text("cancelled")
        assert_freed(http_port, before)


def test_executor_failure_mid_stream_sends_an_error_event(limited_flow):
    """Last in this module: it kills the executor (the Flow is stopped right after)."""
    server, http_port, _ = limited_flow
    url = base(http_port)
    results: dict = {}

    def tgi() -> None:
        with requests.post(f"{url}/generate_stream", json={"inputs": "hello", "parameters": {
                "max_new_tokens": LONG, "ignore_eos": True}}, stream=True, timeout=60) as r:
            results["tgi"] = list(sse_data(r.iter_lines(decode_unicode=True)))

    def oai() -> None:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        chunks = []
        try:
            for c in client.completions.create(model="slow", prompt="hello", max_tokens=LONG, stream=True,
                                               extra_body={"ignore_eos": True}):
                chunks.append(c)
        except openai.APIError as exc:
            results["oai_error"] = exc
        results["oai"] = chunks

    threads = [threading.Thread(target=tgi), threading.Thread(target=oai)]
    for t in threads:
        t.start()
    # both streams decoding: on a loaded machine a client's request can take seconds to arrive
    s = wait_until(http_port, lambda s: s["running"] == 2 and s["steps"] > 5, timeout=30.0)
    assert s["running"] == 2, (s, results)
    executor = executor_process(http_port)
    engines = engine_processes(http_port)
    assert len(engines) == 1, "the decode loop runs in a process of its own"
    executor.send_signal(signal.SIGKILL)
    for t in threads:
        t.join(60)
    _, alive = psutil.wait_procs(engines, timeout=15)
    assert not alive, "the engine process outlived its executor"
    events = results["tgi"]
    assert events and "token" in events[0]
    assert "error" in events[-1] and events[-1]["error_type"] == "generation"
    assert all(e.get("generated_text") is None for e in events[:-1])  # no final event before it
    assert "oai_error" in results and results["oai"], results
    server.stop(timeout=5)

