"""Every HTTP protocol's mapping and error rendering, against a fake executor: no Flow, no
model, milliseconds. The routes are the real ones (gateway/*_routes.py on the skeleton in
gateway/mapping/protocol.py); only the upstream is scripted."""
import json

import pytest

from contract import ErrorKind, field_type, item_type, request_fields
from gateway.edge.backend import error_doc
from gateway.protocols.tgi_routes import TGI_FIELD_NAMES
from schemas import PromptDocument
from tests.gateway.fake_upstream import INFO, tokens
from tests.gateway_helpers import sse_data

# ----- each protocol's minimal request maps to the document its defaults imply -----

def test_minimal_requests_map_to_their_protocols_defaults(http, fake):
    http.post("/v1/completions", json={"prompt": "hi"})
    http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    http.post("/generate", json={"inputs": "hi"})
    http.post("/generate", json={"inputs": "hi", "parameters": {"temperature": 0.5}})
    http.get("/stream", params={"prompt": "hi"})
    completions, chat, tgi, tgi_warped, sse = fake.sent
    assert (completions.max_tokens, completions.do_sample, completions.temperature) == (16, True, 1.0)
    assert chat.max_tokens == min(INFO.max_tokens_limit, INFO.max_context // 2) and chat.do_sample
    assert json.loads(chat.messages) == [{"role": "user", "content": "hi"}] and chat.prompt == ""
    assert (tgi.max_tokens, tgi.do_sample) == (20, False)
    assert tgi_warped.do_sample and tgi_warped.temperature == 0.5  # TGI samples once a warper is set
    assert sse == PromptDocument(id=sse.id, prompt="hi")


def _non_default(f):
    if f.name == "model":
        return INFO.model_id  # a served one (any other is refused: test_an_unknown_model_is_refused...)
    kind, _ = field_type(f)
    if kind is list and item_type(f) is int:
        return [5, 6]
    return {int: 7, float: 0.5, bool: True, list: ["zz"], str: "[0-9]+"}[kind] if f.name != "temperature" else 0.75


@pytest.mark.parametrize("f", request_fields(), ids=lambda f: f.name)
def test_every_engine_request_field_reaches_the_document_on_every_protocol(http, fake, f):
    """Declared once in SamplingParams, a field is accepted by every protocol: under the
    protocol's own name (max_new_tokens, max_tokens) or as an extension under its own."""
    value = _non_default(f)
    # OpenAI always samples; its tools are a list and tool_choice may be an object (see test_tool_mapping)
    # and prompt_logprobs is completions' echo with logprobs (see test_choices_mapping)
    openai_name = {"do_sample": None, "tools": None, "tool_choice": None, "logprobs": None,
                   "prompt_logprobs": None}.get(f.name, f.name)
    if openai_name:
        http.post("/v1/completions", json={"prompt": "hi", openai_name: value})
    tgi_name = TGI_FIELD_NAMES.get(f.name, f.name)
    if f.name == "grammar":  # TGI's grammar is an object; a Lark or GBNF grammar is its type "grammar"
        value = {"type": "grammar", "value": value}
    sampled = {"do_sample": True} if f.name == "n" else {}  # TGI's best_of samples
    http.post("/generate", json={"inputs": "hi", "parameters": {tgi_name: value, **sampled}})
    value = value["value"] if f.name == "grammar" else value
    http.request("GET", "/stream", content=json.dumps({"prompt": "hi", f.name: value}))
    assert fake.sent and all(getattr(d, f.name) == value for d in fake.sent), (f.name, fake.sent)
    assert len(fake.sent) == (3 if openai_name else 2)


# ----- error rendering: the protocol's own status and body, the field named -----

def test_a_field_the_document_cannot_carry_is_named_by_every_protocol(http, fake):
    r = http.post("/v1/completions", json={"prompt": "hi", "seed": 2**64})
    assert r.status_code == 400 and r.json()["error"]["param"] == "seed"
    r = http.post("/generate", json={"inputs": "hi", "parameters": {"top_k": 2**40}})
    assert r.status_code == 422 and r.json()["error"].startswith("top_k") and r.json()["error_type"] == "validation"
    r = http.get("/stream", params={"prompt": "hi", "max_tokens": "many"})
    event = list(sse_data(r.text.splitlines()))[0]
    assert r.status_code == 422 and event["error_field"] == "max_tokens"
    for path, body in (("/v1/completions", {"prompt": "hi", "temperature": "hot"}),
                       ("/v1/messages", {"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}],
                                         "temperature": "hot"}),
                       ("/v1/responses", {"input": "hi", "temperature": "hot"})):
        r = http.post(path, json=body)
        error = r.json()["error"]  # no coercion, and a number is what the message asks for
        assert r.status_code == 400 and error.get("param", "temperature") == "temperature", (path, error)
        assert "temperature" in error["message"] and "valid number" in error["message"], (path, error)
    assert not fake.sent  # nothing reached the executor
    assert http.post("/v1/completions", json={"prompt": "hi", "temperature": 1}).status_code == 200
    assert fake.sent[-1].temperature == 1.0  # an integer is a number


@pytest.mark.parametrize("error_kind,openai_status,status", [
    (ErrorKind.VALIDATION, 400, 422), (ErrorKind.OVERLOADED, 429, 429), (ErrorKind.GENERATION, 500, 500),
    (ErrorKind.UNPROCESSABLE, 422, 422)])
def test_refusals_before_the_first_token_are_statuses(http, fake, error_kind, openai_status, status):
    fake.script = [error_doc("max_tokens: too many", error_kind, "max_tokens" if error_kind is ErrorKind.VALIDATION
                             else None)]
    for stream in (False, True):
        r = http.post("/v1/completions", json={"prompt": "hi", "stream": stream})
        body = r.json()["error"]
        assert r.status_code == openai_status and body["code"] == error_kind.value
        assert body["param"] == ("max_tokens" if error_kind is ErrorKind.VALIDATION else None)
        r = http.post("/generate_stream" if stream else "/generate", json={"inputs": "hi"})
        assert r.status_code == status and r.json()["error_type"] == error_kind.value
    r = http.get("/stream", params={"prompt": "hi"})
    assert r.status_code == status and list(sse_data(r.text.splitlines()))[0]["error_type"] == error_kind.value


def test_a_failure_mid_stream_ends_each_stream_with_one_error_event(http, fake):
    fake.script = tokens("Hello", " world")[:1] + [error_doc("decode step failed")]
    events = list(sse_data(http.post("/v1/completions", json={"prompt": "hi", "stream": True})
                           .text.splitlines()))
    assert events[0]["choices"][0]["text"] == "Hello" and events[1]["error"]["code"] == "generation"
    assert events[-1] == "[DONE]" and len(events) == 3
    events = list(sse_data(http.post("/generate_stream", json={"inputs": "hi"}).text.splitlines()))
    assert [e.get("index") for e in events] == [1, None] and events[-1]["error_type"] == "generation"
    events = list(sse_data(http.get("/stream", params={"prompt": "hi"}).text.splitlines()))
    assert events[0]["text"] == "Hello" and events[1]["error"] == "decode step failed" and len(events) == 2


# ----- the protocols' answers -----

def test_openai_answers(http, fake):
    fake.script = tokens("Hello", " world", seed=7, finish="eos_token")
    whole = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]}).json()
    assert whole["model"] == "fake-model" and whole["seed"] == 7 and whole["object"] == "chat.completion"
    assert whole["choices"][0]["message"] == {"role": "assistant", "content": "Hello world"}
    assert whole["choices"][0]["finish_reason"] == "stop" and whole["usage"]["completion_tokens"] == 2
    events = list(sse_data(http.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "x"}], "stream": True,
        "stream_options": {"include_usage": True}}).text.splitlines()))
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-2]) == "Hello world"
    assert events[-2]["choices"] == [] and events[-2]["usage"]["total_tokens"] == 5 and events[-1] == "[DONE]"
    echo = http.post("/v1/completions", json={"prompt": "Say:", "echo": True}).json()
    assert echo["choices"][0]["text"] == "Say:Hello world"


def test_tgi_answers(http, fake):
    fake.script = tokens("Hello", " world", seed=5)
    body = http.post("/generate", json={"inputs": "Say:", "parameters": {"details": True, "return_full_text": True}}).json()
    assert body["generated_text"] == "Say:Hello world" and body["details"]["seed"] == 5
    assert [t["text"] for t in body["details"]["tokens"]] == ["Hello", " world"]
    assert http.post("/", json={"inputs": "x"}).json() == [{"generated_text": "Hello world"}]
    events = list(sse_data(http.post("/", json={"inputs": "x", "stream": True}).text.splitlines()))
    assert [e["index"] for e in events] == [1, 2] and events[-1]["generated_text"] == "Hello world"
    info = http.get("/info").json()
    assert info["model_id"] == "fake-model" and info["max_stop_sequences"] == 16


def test_a_route_that_is_not_served_is_refused_in_the_protocols_own_shape(http, fake):
    """404 (and 405) as every other refusal: OpenAI's error object under /v1, Anthropic's under
    /v1/messages, Ollama's under /api, TGI's elsewhere; never FastAPI's {"detail": ...}."""
    r = http.post("/v1/audio/speech", json={"input": "hi"})
    assert r.status_code == 404 and r.json()["error"]["type"] == "invalid_request_error"
    assert r.json()["error"]["code"] == "not_found" and "/v1/audio/speech" in r.json()["error"]["message"]
    r = http.post("/v1/messages/batches", json={})
    assert r.status_code == 404 and r.json()["type"] == "error" and r.json()["error"]["type"] == "not_found_error"
    r = http.post("/api/create", json={"model": "m"})
    assert r.status_code == 404 and r.json() == {"error": "/api/create: no such route here"}
    r = http.get("/nowhere")
    assert r.status_code == 404 and r.json()["error_type"] == "not_found" and "/nowhere" in r.json()["error"]
    r = http.get("/v1/chat/completions")
    assert r.status_code == 405 and "GET" in r.json()["error"]["message"]
    assert not fake.sent
