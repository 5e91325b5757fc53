"""Hostile and careless input, and safe defaults: cheap checks first (nothing large is parsed,
rendered or tokenized, nobody else stalls), no stream is ever replayed, malformed input gets
a 4xx / error event naming the field on every protocol, and the service is closed to other
sites, to the network behind the gateway and to curious callers unless opened on purpose."""
import asyncio
import json
import threading
import time

import grpc
import pytest
import requests
import websockets
from docarray import DocList  # noqa: F401 - jina's protos need docarray loaded first
from google.protobuf import empty_pb2
from jina.proto import jina_pb2_grpc
from websockets.exceptions import InvalidStatus

from client import StreamError, generate, stream
from testing.flows import start_flow
from tests.conftest import ROOT
from tests.gateway_helpers import executor_process, listening, sse_data

DEEP = "[" * 100_000 + "]" * 100_000
SURROGATE = '"a\\ud800b"'  # JSON text of a string with a lone surrogate


def url(flow, path: str) -> str:
    return f"http://127.0.0.1:{flow[1]}{path}"


# ----- cheap checks first: oversized input never stalls anybody -----

def test_oversized_requests_are_refused_before_any_work(flow):
    bodies = {  # the reproductions of the issue: what each is refused with
        "/v1/chat/completions": (json.dumps({"max_tokens": 3, "temperature": 0,
                                             "messages": [{"role": "user", "content": "hi"}] * 4000}), 400, "messages"),
        "/v1/completions": (json.dumps({"max_tokens": 3, "prompt": "word " * 4_200_000}), 413, "body"),
        "/generate": (json.dumps({"inputs": "hi", "parameters": {"stop": ["abcde"] * 5_000_000}}), 413, "body"),
        "/generate_stream": (json.dumps({"inputs": "x" * 300_000}), 422, "inputs"),
    }
    executor = executor_process(flow[1])
    idle_rss = executor.memory_info().rss
    health: list[float] = []
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            started = time.perf_counter()
            requests.get(url(flow, "/health"), timeout=60).raise_for_status()
            health.append(time.perf_counter() - started)
            time.sleep(0.02)
    poller = threading.Thread(target=poll)
    poller.start()
    try:
        for path, (body, status, field) in bodies.items():
            r = requests.post(url(flow, path), data=body, headers={"Content-Type": "application/json"}, timeout=60)
            assert r.status_code == status, (path, r.text[:300])
            error = r.json()["error"]
            assert (error["param"] if isinstance(error, dict) else error.split(":")[0]) == field, r.text
    finally:
        done.set()
        poller.join()
    # a stall detector, not a benchmark: the old code stalled /health for 30 to 60 s here
    assert health and max(health) < 2.0, max(health)
    assert executor.memory_info().rss - idle_rss < 100e6


async def test_oversized_grpc_requests_are_refused_at_the_gateway(flow):
    grpc_port, _ = flow
    for kwargs, field in ((dict(prompt="x" * 300_000), "prompt"), (dict(stop=["ab"] * 5000), "stop"),
                          (dict(prompt="word " * 500_000), "body")):
        prompt = kwargs.pop("prompt", "hi")
        with pytest.raises(StreamError) as err:
            await generate(prompt, port=grpc_port, **kwargs)
        assert err.value.error_type == "validation" and str(err.value).startswith(f"validation: {field}")


async def test_long_conversations_within_limits_are_trimmed_off_the_event_loop(flow):
    """511 messages: rendered and trimmed to the tiny model's 512-token context, quickly."""
    grpc_port, _ = flow
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": "hello there " * 3}
                for i in range(511)]
    out = await generate("", port=grpc_port, max_tokens=4, messages=messages)
    assert out.finish_reason == "length" and out.prompt_tokens <= 508


# ----- no stream is ever replayed -----

def test_a_failure_mid_stream_is_reported_once_never_replayed(tmp_path):
    calls = tmp_path / "calls"
    server, grpc_port, http_port = start_flow(
        "unused", tmp_path, executor={"uses": str(ROOT / "tests/fixtures/faulty.yml"), "uses_with": {}},
        env={"FAULTY_CALLS": str(calls)})
    try:
        with requests.post(f"http://127.0.0.1:{http_port}/generate_stream", json={"inputs": "tgi"},
                           stream=True, timeout=60) as r:
            events = list(sse_data(r.iter_lines(decode_unicode=True)))
        with requests.get(f"http://127.0.0.1:{http_port}/stream", json={"prompt": "sse"}, stream=True,
                          timeout=60) as r:
            docs = list(sse_data(r.iter_lines(decode_unicode=True)))
        got = asyncio.run(_grpc_docs(grpc_port))
    finally:
        server.stop()
    assert [e["index"] for e in events[:-1]] == [1, 2, 3] and "error" in events[-1], events
    assert [d["index"] for d in docs[:-1]] == [0, 1, 2] and docs[-1]["error"], docs
    assert [d.index for d in got[:-1]] == [0, 1, 2] and isinstance(got[-1], StreamError), got
    assert calls.read_text().split() == ["tgi", "sse", "grpc"]  # each called once: no retry


async def _grpc_docs(port: int) -> list:
    out: list = []
    try:
        async for doc in stream("grpc", port=port):
            out.append(doc)
    except StreamError as exc:
        out.append(exc)
    return out


# ----- malformed input: a 4xx, a status or an error event that names the field -----

@pytest.mark.parametrize("path,body,status,field", [
    ("/v1/completions", DEEP, 400, None), ("/v1/chat/completions", DEEP, 400, None),
    ("/generate", DEEP, 422, None), ("/generate_stream", DEEP, 422, None), ("/", DEEP, 422, None),
    ("/v1/completions", '{"prompt": ' + SURROGATE + '}', 400, "prompt"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": ' + SURROGATE + '}]}',
     400, "messages"),
    ("/generate", '{"inputs": ' + SURROGATE + '}', 422, "inputs"),
    ("/v1/completions", '{"prompt": "x", "max_tokens": 4294967296}', 400, "max_tokens"),
    ("/v1/completions", '{"prompt": "x", "seed": 18446744073709551616}', 400, "seed"),
    ("/generate", '{"inputs": "x", "parameters": {"top_k": 2147483648}}', 422, "top_k"),
])
def test_malformed_http_input_is_a_4xx_naming_the_field(flow, path, body, status, field):
    r = requests.post(url(flow, path), data=body, headers={"Content-Type": "application/json"}, timeout=60)
    assert r.status_code == status, r.text[:300]
    error = r.json()["error"]
    message = error["message"] if isinstance(error, dict) else error
    if isinstance(error, dict):
        assert error["param"] == field
    if field:
        assert message.startswith(field), message


@pytest.mark.parametrize("query,body,field", [
    ({"prompt": "x", "max_tokens": "abc"}, None, "max_tokens"), ({"prompt": "x", "top_k": "2147483648"}, None, "top_k"),
    (None, '{"prompt": ' + SURROGATE + '}', "prompt"), (None, DEEP, None),
])
def test_malformed_jina_sse_input_is_a_422_naming_the_field(flow, query, body, field):
    r = requests.get(url(flow, "/stream"), params=query, data=body, timeout=60)
    assert r.status_code == 422, r.text[:300]
    event = next(e for e in sse_data(r.text.splitlines()) if isinstance(e, dict))
    assert event["error_type"] == "validation" and event["error_field"] == field, event


def test_jina_sse_takes_repeated_query_parameters(flow):
    r = requests.get(url(flow, "/stream"), params=[("prompt", "the quick"), ("max_tokens", "6"),
                                                  ("stop", "zzz"), ("stop", "yyy")], timeout=60)
    assert r.status_code == 200
    assert [e for e in sse_data(r.text.splitlines())][-1]["finish_reason"] in ("length", "eos_token")


async def test_malformed_websocket_frames_get_error_events_and_the_socket_stays(flow):
    async with websockets.connect(f"ws://127.0.0.1:{flow[1]}/chat") as ws:
        for frame, field in ((b"\x00\x01binary", "message"), (DEEP, "message"),
                             ('{"prompt": ' + SURROGATE + '}', "prompt"), ('{"prompt": "x", "seed": -1}', "seed")):
            await ws.send(frame)
            event = json.loads(await ws.recv())
            assert event["type"] == "error" and event["error"].startswith(field), event
        await ws.send(json.dumps({"prompt": "still here?", "max_tokens": 2}))
        while (event := json.loads(await ws.recv()))["type"] == "token":
            pass
        assert event["type"] == "end" and event["generated_tokens"] == 2


def test_openai_error_param_is_the_field_or_null(flow):
    r = requests.post(url(flow, "/v1/completions"), json={"prompt": "x", "top_p": 7}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "top_p"
    r = requests.post(url(flow, "/v1/completions"), json={"prompt": "x", "max_tokens": 100000},
                      timeout=60)
    assert r.json()["error"]["param"] == "max_tokens"
    r = requests.post(url(flow, "/v1/completions"), json={"prompt": "", "max_tokens": 3}, timeout=60)
    assert r.json()["error"]["param"] == "prompt"


# ----- safe defaults -----

def test_other_sites_cannot_call_or_open_the_websocket(flow):
    evil = {"Origin": "https://evil.example"}
    r = requests.post(url(flow, "/v1/completions"), json={"prompt": "x", "max_tokens": 1}, headers=evil, timeout=60)
    assert "access-control-allow-origin" not in {k.lower() for k in r.headers}
    r = requests.options(url(flow, "/v1/completions"), headers={**evil, "Access-Control-Request-Method": "POST"},
                         timeout=60)
    assert "access-control-allow-origin" not in {k.lower() for k in r.headers}

    async def ws(origin: str) -> str:
        try:
            async with websockets.connect(f"ws://127.0.0.1:{flow[1]}/chat", origin=origin) as conn:
                await conn.send(json.dumps({"prompt": "x", "max_tokens": 1}))
                return json.loads(await conn.recv())["type"]
        except InvalidStatus as exc:
            return f"refused {exc.response.status_code}"
    assert asyncio.run(ws("https://evil.example")) == "refused 403"
    assert asyncio.run(ws(f"http://127.0.0.1:{flow[1]}")) == "token"  # the chat page's own origin


def test_debug_pages_and_status_are_closed(flow):
    for path in ("/docs", "/redoc", "/openapi.json", "/dry_run", "/status"):
        assert requests.get(url(flow, path), timeout=60).status_code == 404, path
    assert requests.get(url(flow, "/health"), timeout=60).status_code == 200

    async def status() -> str:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{flow[0]}") as channel:
            return str(await jina_pb2_grpc.JinaInfoRPCStub(channel)._status(empty_pb2.Empty()))
    assert asyncio.run(status()) == ""  # no environment, no addresses


def test_the_executor_listens_on_loopback_only(flow):
    addresses = listening(executor_process(flow[1]))
    assert addresses and all(ip in ("127.0.0.1", "::ffff:127.0.0.1") for ip, _ in addresses), addresses


def test_request_limits_come_from_the_environment():
    from contract.limits import RequestLimits
    limits = RequestLimits.from_env({"LLM_MAX_STOP_SEQUENCES": "4", "LLM_MAX_BODY_BYTES": "1000"})
    assert (limits.max_stop_sequences, limits.max_body_bytes, limits.max_messages) == (4, 1000, 512)
    with pytest.raises(ValueError, match="LLM_MAX_MESSAGES"):
        RequestLimits.from_env({"LLM_MAX_MESSAGES": "many"})


def test_origins_are_opened_deliberately(monkeypatch):
    from gateway.config import config
    from gateway.edge.http_guard import origin_allowed

    def started_with(origins: str) -> None:
        """LLM_CORS_ORIGINS as a gateway process starting now reads it (once, into its config)."""
        monkeypatch.setenv("LLM_CORS_ORIGINS", origins)
        config.cache_clear()
    try:
        started_with("")
        assert origin_allowed(None, "localhost:1") and origin_allowed("http://localhost:1", "localhost:1")
        assert not origin_allowed("https://evil.example", "localhost:1")
        started_with("https://app.example, https://other.example/")
        assert origin_allowed("https://other.example", "localhost:1")
        assert not origin_allowed("https://evil.example", "localhost:1")
        started_with("*")
        assert origin_allowed("https://evil.example", "localhost:1")
    finally:
        monkeypatch.undo()
        config.cache_clear()


def test_a_flow_whose_port_was_taken_meanwhile_starts_on_fresh_ones(tmp_path, monkeypatch):
    """A random port can be taken between being picked and being bound (another test's process
    shares the ephemeral range): the Flow then exits ("address already in use"), and the starter
    tries fresh ports instead of failing the test."""
    import socket
    import urllib.request

    from testing import flows, procs
    taken = socket.socket()
    taken.bind(("0.0.0.0", 0))
    taken.listen()
    picks = iter([procs.free_port(), taken.getsockname()[1]])  # the first try's HTTP port is taken
    monkeypatch.setattr(flows, "free_port", lambda: next(picks, None) or procs.free_port())
    try:
        server, _, http_port = flows.start_flow("unused", tmp_path, executor={
            "uses": str(ROOT / "tests/fixtures/faulty.yml"), "uses_with": {}})
        try:
            assert http_port != taken.getsockname()[1]
            with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/", timeout=10) as answer:
                assert answer.status == 200
        finally:
            server.stop()
    finally:
        taken.close()
