"""LLM_API_KEY: without the key every protocol refuses (401 in its own error shape, gRPC
UNAUTHENTICATED, the WebSocket handshake); with it every protocol serves; health, metrics
and the chat page stay open."""
import json
import subprocess
import sys
import time

import grpc
import pytest
import requests
import websockets
from grpc_health.v1 import health_pb2, health_pb2_grpc
from websockets.exceptions import InvalidStatus

from client import StreamError, generate
from gateway.protocols.chat_files import ASSETS
from testing.flows import start_flow
from tests.conftest import ROOT
from tests.gateway_helpers import engine_processes, executor_process

KEY = "s3cret-key"


@pytest.fixture(scope="module")
def keyed_flow(gpt2_model, tmp_path_factory):
    # this Flow also runs the decode loop on a thread of the executor (core_process: false)
    server, grpc_port, http_port = start_flow(gpt2_model, tmp_path_factory.mktemp("keyed"), env={"LLM_API_KEY": KEY},
                                              core_process=False)
    assert not executor_process(http_port).children(), "core_process: false starts no engine process"
    deadline = time.monotonic() + 10  # and the one the launcher started ahead went (killed at the claim)
    while engine_processes(http_port) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not engine_processes(http_port)
    yield grpc_port, http_port
    server.stop()


ROUTES = [("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2}, "openai"),
          ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                            "max_tokens": 2}, "openai"),
          ("GET", "/v1/models", None, "openai"),
          ("POST", "/generate", {"inputs": "hi", "parameters": {"max_new_tokens": 2}}, "tgi"),
          ("POST", "/generate_stream", {"inputs": "hi", "parameters": {"max_new_tokens": 2}}, "tgi"),
          ("POST", "/", {"inputs": "hi", "parameters": {"max_new_tokens": 2}}, "tgi"),
          ("GET", "/stream", {"prompt": "hi", "max_tokens": 2}, "tgi"),
          ("GET", "/info", None, "tgi")]


@pytest.mark.parametrize("method,path,body,shape", ROUTES)
def test_http_routes_need_the_key(keyed_flow, method, path, body, shape):
    url = f"http://127.0.0.1:{keyed_flow[1]}{path}"
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        r = requests.request(method, url, json=body, headers=headers, timeout=60)
        assert r.status_code == 401, (path, r.text)
        error = r.json()["error"]
        assert (error["type"] == "authentication_error") if shape == "openai" else r.json()["error_type"] == "authentication"
    r = requests.request(method, url, json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
    assert r.status_code == 200, (path, r.text)


def test_health_metrics_and_the_page_stay_open(keyed_flow):
    base = f"http://127.0.0.1:{keyed_flow[1]}"
    for path in ("/health", "/metrics", "/chat-ui", "/", *(f"/chat-ui/{name}" for name in ASSETS)):
        assert requests.get(f"{base}{path}", timeout=60).status_code == 200, path
    assert requests.get(f"{base}/chat-ui/vendor/other.js", timeout=60).status_code == 401  # only the page's own files
    # the page's settings name the models: the page sends its key for them
    assert requests.get(f"{base}/chat-ui/settings", timeout=60).status_code == 401
    assert requests.get(f"{base}/chat-ui/settings", headers={"Authorization": f"Bearer {KEY}"}, timeout=60).ok


async def test_websocket_needs_the_key(keyed_flow):
    url = f"ws://127.0.0.1:{keyed_flow[1]}/chat"
    with pytest.raises(InvalidStatus):
        async with websockets.connect(url):
            pass
    for connect in (dict(uri=f"{url}?api_key={KEY}"), dict(uri=url, additional_headers={"Authorization": f"Bearer {KEY}"})):
        async with websockets.connect(**connect) as ws:
            await ws.send(json.dumps({"prompt": "hi", "max_tokens": 2}))
            while (event := json.loads(await ws.recv()))["type"] == "token":
                pass
            assert event["type"] == "end"


async def test_grpc_needs_the_key(keyed_flow):
    grpc_port = keyed_flow[0]
    with pytest.raises(StreamError) as err:
        await generate("hi", port=grpc_port, max_tokens=2, api_key="")
    assert err.value.error_type == "unauthenticated"
    assert (await generate("hi", port=grpc_port, max_tokens=2, api_key=KEY)).finish_reason == "length"
    with pytest.raises(StreamError):  # and over SSE, with the Python client
        await generate("hi", port=keyed_flow[1], protocol="http", max_tokens=2, api_key="")
    assert (await generate("hi", port=keyed_flow[1], protocol="http", max_tokens=2, api_key=KEY)).generated_tokens == 2
    async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:  # probes need no key
        health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""))
        assert health.status == health_pb2.HealthCheckResponse.SERVING


def test_the_cli_takes_the_key(keyed_flow):
    cmd = [sys.executable, "-m", "client", "hi", "--max-tokens", "2", "--port", str(keyed_flow[0])]
    refused = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "UNAUTHENTICATED" in refused.stderr.upper(), refused.stderr
    served = subprocess.run(cmd + ["--api-key", KEY], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert served.returncode == 0 and "finish_reason=length" in served.stderr, served.stderr


