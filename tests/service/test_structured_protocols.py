"""Structured output through a real Flow (tiny model): every protocol enforces it, and a
constraint that does not compile is refused before any token, naming the field, on each."""
import json
import re

import pytest
import requests
import websockets

from client import generate
from tests.gateway_helpers import sse_data
from tests.service.test_grpc_api import call, request, text

REGEX = "[a-z]{3}-[0-9]{2}"


async def test_every_protocol_enforces_the_same_regex(flow):
    grpc_port, http_port = flow
    base = f"http://127.0.0.1:{http_port}"
    expected = (await generate("hello", port=grpc_port, max_tokens=20, regex=REGEX)).generated_text
    assert re.fullmatch(REGEX, expected)
    openai = requests.post(f"{base}/v1/completions", timeout=60, json={
        "prompt": "hello", "max_tokens": 20, "temperature": 0, "structured_outputs": {"regex": REGEX}})
    tgi = requests.post(f"{base}/generate", timeout=60, json={
        "inputs": "hello", "parameters": {"max_new_tokens": 20, "grammar": {"type": "regex", "value": REGEX}}})
    streamed = requests.post(f"{base}/v1/completions", timeout=60, stream=True, json={
        "prompt": "hello", "max_tokens": 20, "temperature": 0, "guided_regex": REGEX, "stream": True})
    chunks = [e for e in sse_data(streamed.iter_lines(decode_unicode=True)) if e != "[DONE]"]
    assert openai.json()["choices"][0]["text"] == tgi.json()["generated_text"] == expected
    assert "".join(c["choices"][0]["text"] for c in chunks) == expected
    assert openai.json()["choices"][0]["finish_reason"] == chunks[-1]["choices"][0]["finish_reason"] == "stop"


BAD = {"json_schema": json.dumps({"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}})}


async def test_a_bad_constraint_is_refused_on_every_protocol_naming_the_field(flow):
    grpc_port, http_port = flow
    base = f"http://127.0.0.1:{http_port}"
    code, (details,) = await call(grpc_port, request({"prompt": text("hi"), "json_schema": text(BAD["json_schema"])}))
    assert code == "INVALID_ARGUMENT" and details.startswith("json_schema: does not compile") and "nowhere" in details
    r = requests.post(f"{base}/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": "hi"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": json.loads(BAD["json_schema"])}}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format"
    r = requests.post(f"{base}/generate", timeout=60, json={
        "inputs": "hi", "parameters": {"grammar": {"type": "regex", "value": "a(b"}}})
    assert r.status_code == 422 and r.json()["error"].startswith("grammar: does not compile")
    r = requests.get(f"{base}/stream", timeout=60, data=json.dumps({"prompt": "hi", "grammar": "start: nope"}))
    event = list(sse_data(r.text.splitlines()))[0]
    assert r.status_code == 422 and event["error_field"] == "grammar"
    async with websockets.connect(f"ws://127.0.0.1:{http_port}/chat") as ws:
        await ws.send(json.dumps({"prompt": "hi", "regex": "a(b"}))
        event = json.loads(await ws.recv())
        assert event["type"] == "error" and event["error"].startswith("regex:")
        await ws.send(json.dumps({"prompt": "hi", "choice": ["yes", "no"], "max_tokens": 8}))
        texts = []
        while (event := json.loads(await ws.recv()))["type"] == "token":
            texts.append(event["text"])
        assert "".join(texts) in ("yes", "no") and event["finish_reason"] == "eos_token"


@pytest.mark.parametrize("two", [{"regex": "a", "choice": ["a"]}, {"json_object": True, "grammar": "start: \"a\""}])
async def test_two_constraints_are_refused(flow, two):
    base = f"http://127.0.0.1:{flow[1]}"
    r = requests.get(f"{base}/stream", timeout=60, data=json.dumps({"prompt": "hi", **two}))
    assert r.status_code == 422 and "only one structured-output field" in list(sse_data(r.text.splitlines()))[0]["error"]



def test_the_cli_passes_tools(flow, tmp_path):
    import subprocess
    import sys

    from tests.conftest import ROOT
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["x"]}}}]
    (tmp_path / "tools.json").write_text(json.dumps(tools))
    run = subprocess.run([sys.executable, "-m", "client", "call f", "--port", str(flow[0]), "--max-tokens", "120",
                          "--tools", str(tmp_path / "tools.json"), "--tool-choice", "f", "--no-parallel-tool-calls"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert run.returncode == 0 and "finish_reason=tool_calls" in run.stderr, run.stderr
