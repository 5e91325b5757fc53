"""Structured output with the trained default model, through the clients applications use:
the openai SDK's `parse`, LangChain's `with_structured_output`, huggingface_hub's
InferenceClient with a grammar, and the Node.js gRPC client. The same request in plain
decoding answers in prose; constrained, every protocol gives the same valid object."""
import json
from pathlib import Path

import jsonschema
import openai
import pytest
import requests
import websockets
from pydantic import BaseModel

from client import generate
from tests.gateway_helpers import sse_data
from tests.real_model.test_real_model import ask_ws, user
from tests.service.test_grpc_api import node, node_client  # noqa: F401 - the fixture

QUESTION = "Invent a person: their name, age and city."
MAX_TOKENS = 80


class Person(BaseModel):
    name: str
    age: int
    city: str


SCHEMA = Person.model_json_schema()


def api(http_port: int) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{http_port}/v1", api_key="unused", max_retries=0)


def test_plain_decoding_answers_in_prose_and_parse_gets_the_object(real_flow):
    client = api(real_flow[1])
    plain = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=user(QUESTION), temperature=0, max_tokens=MAX_TOKENS)
    with pytest.raises(json.JSONDecodeError):
        json.loads(plain.choices[0].message.content)
    parsed = client.chat.completions.parse(model="SmolLM2-135M-Instruct", messages=user(QUESTION), temperature=0,
                                           max_tokens=MAX_TOKENS, response_format=Person)
    choice = parsed.choices[0]
    assert isinstance(choice.message.parsed, Person) and choice.finish_reason == "stop"
    jsonschema.validate(json.loads(choice.message.content), SCHEMA)


def test_langchain_with_structured_output_json_schema(real_flow):
    from langchain_openai import ChatOpenAI
    llm = ChatOpenAI(base_url=f"http://127.0.0.1:{real_flow[1]}/v1", api_key="unused", model="SmolLM2-135M-Instruct", temperature=0,
                     max_tokens=MAX_TOKENS, max_retries=0)
    person = llm.with_structured_output(Person, method="json_schema").invoke(QUESTION)
    assert isinstance(person, Person) and person.name and person.city


def test_huggingface_inference_client_with_a_grammar(real_flow):
    from huggingface_hub import InferenceClient
    hf = InferenceClient(base_url=f"http://127.0.0.1:{real_flow[1]}")
    out = hf.text_generation("A person as JSON: ", max_new_tokens=MAX_TOKENS, grammar={"type": "json", "value": SCHEMA})
    jsonschema.validate(json.loads(out), SCHEMA)
    streamed = "".join(hf.text_generation("A person as JSON: ", max_new_tokens=MAX_TOKENS, stream=True,
                                          grammar={"type": "json", "value": SCHEMA}))
    assert streamed == out


def test_node_grpc_client_with_a_schema_field(real_flow, node_client, tmp_path):  # noqa: F811
    schema_file = tmp_path / "person.json"
    schema_file.write_text(json.dumps(SCHEMA))
    got = node(node_client, "--port", str(real_flow[0]), "--chat", "--max-tokens", str(MAX_TOKENS),
               "--json-schema", str(schema_file), QUESTION)
    assert got.returncode == 0, got.stderr
    jsonschema.validate(json.loads(got.stdout), SCHEMA)
    assert b"finish_reason=eos_token" in got.stderr


def openai_text(http_port: int, stream: bool, **extra) -> str:
    body = {"messages": user(QUESTION), "max_tokens": MAX_TOKENS, "temperature": 0, "stream": stream,
            "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}, **extra}
    r = requests.post(f"http://127.0.0.1:{http_port}/v1/chat/completions", json=body, timeout=120, stream=stream)
    if not stream:
        return r.json()["choices"][0]["message"]["content"]
    events = [e for e in sse_data(r.iter_lines(decode_unicode=True)) if e != "[DONE]"]
    return "".join(e["choices"][0]["delta"].get("content") or "" for e in events)


async def test_every_protocol_enforces_the_same_constraint(real_flow):
    grpc_port, http_port = real_flow
    schema = json.dumps(SCHEMA)
    expected = openai_text(http_port, stream=False)
    jsonschema.validate(json.loads(expected), SCHEMA)
    sse = requests.get(f"http://127.0.0.1:{http_port}/stream", timeout=120, data=json.dumps(
        {"messages": json.dumps(user(QUESTION)), "max_tokens": MAX_TOKENS, "json_schema": schema}))
    async with websockets.connect(f"ws://127.0.0.1:{http_port}/chat") as ws:
        ws_text, end = await ask_ws(ws, QUESTION, max_tokens=MAX_TOKENS, json_schema=schema)
    got = {"openai-stream": openai_text(http_port, stream=True),
           "openai-stream-interval-4": openai_text(http_port, stream=True, stream_interval=4),
           "grpc": (await generate("", port=grpc_port, messages=user(QUESTION), max_tokens=MAX_TOKENS,
                                   json_schema=schema)).generated_text,
           "jina-sse": [e for e in sse_data(sse.text.splitlines())][-1]["generated_text"],
           "websocket": ws_text}
    assert got == {route: expected for route in got}
    assert end["finish_reason"] == "eos_token"


def test_a_schema_that_does_not_compile_is_refused_before_any_token(real_flow):
    r = requests.post(f"http://127.0.0.1:{real_flow[1]}/v1/chat/completions", timeout=60, json={
        "messages": user(QUESTION), "response_format": {
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": {
                "a": {"$ref": "#/definitions/missing"}}}}}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format", r.text
    assert "missing" in r.json()["error"]["message"]


def test_docs_show_the_structured_output_example(real_flow):
    """docs/api.md's structured-output example is what the service answers."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text()
    marker = "<!-- STRUCTURED-EXAMPLE -->"
    assert marker in doc
    body = json.loads(doc.split(marker)[1].split("```")[1].removeprefix("json\n"))
    r = requests.post(f"http://127.0.0.1:{real_flow[1]}/v1/chat/completions", json=body, timeout=120)
    content = r.json()["choices"][0]["message"]["content"]
    jsonschema.validate(json.loads(content), body["response_format"]["json_schema"]["schema"])
