"""Structured output under every protocol's names, mapped onto the contract's fields; what is
not served is refused naming the field, before anything reaches the executor."""
import json

import pytest

from contract import ErrorKind

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
CHAT = {"messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(("extra", "field", "value"), [
    ({"response_format": {"type": "json_object"}}, "json_object", True),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA, "strict": True}}},
     "json_schema", SCHEMA),
    ({"response_format": {"type": "json_object", "value": SCHEMA}}, "json_schema", SCHEMA),  # TGI's chat route
    ({"structured_outputs": {"json": SCHEMA}}, "json_schema", SCHEMA),
    ({"structured_outputs": {"regex": "[a-z]+"}}, "regex", "[a-z]+"),
    ({"structured_outputs": {"choice": ["yes", "no"]}}, "choice", ["yes", "no"]),
    ({"structured_outputs": {"grammar": 'root ::= "a"'}}, "grammar", 'root ::= "a"'),
    ({"guided_json": SCHEMA}, "json_schema", SCHEMA),
    ({"guided_json": json.dumps(SCHEMA)}, "json_schema", SCHEMA),
    ({"guided_regex": "[0-9]"}, "regex", "[0-9]"),
    ({"guided_choice": ["a", "b"]}, "choice", ["a", "b"]),
    ({"guided_grammar": "start: \"a\""}, "grammar", "start: \"a\""),
    ({"json_schema": json.dumps(SCHEMA)}, "json_schema", SCHEMA),  # the contract's own name, an extension
])
@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"])
def test_openai_structured_output_reaches_the_document(http, fake, route, extra, field, value):
    body = {**CHAT, **extra} if "chat" in route else {"prompt": "hi", **extra}
    r = http.post(route, json=body)
    assert r.status_code == 200, r.text
    got = getattr(fake.sent[-1], field)
    assert (json.loads(got) if field == "json_schema" else got) == value


def test_response_format_text_is_no_constraint(http, fake):
    assert http.post("/v1/chat/completions", json={**CHAT, "response_format": {"type": "text"}}).status_code == 200
    assert fake.sent[-1].json_schema is None and not fake.sent[-1].json_object


@pytest.mark.parametrize(("extra", "param"), [
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"response_format": {"type": "json_schema"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": "{not json"}}}, "response_format"),
    ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex"),
    ({"structured_outputs": {"xml": "<a/>"}}, "structured_outputs"),
    ({"functions": [{"name": "f"}]}, "functions"),
    ({"logit_bias": {"50256": -100}}, "logit_bias"),
])
def test_openai_refuses_what_it_would_not_enforce_naming_the_field(http, fake, extra, param):
    r = http.post("/v1/chat/completions", json={**CHAT, **extra})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert not fake.sent


@pytest.mark.parametrize(("grammar", "field", "value"), [
    ({"type": "json", "value": SCHEMA}, "json_schema", SCHEMA),
    ({"type": "json", "value": json.dumps(SCHEMA)}, "json_schema", SCHEMA),
    ({"type": "json_schema", "value": {"name": "x", "schema": SCHEMA}}, "json_schema", SCHEMA),
    ({"type": "regex", "value": "[0-9]+"}, "regex", "[0-9]+"),
    ({"type": "grammar", "value": 'root ::= "a"'}, "grammar", 'root ::= "a"'),
])
def test_tgi_grammar_reaches_the_document(http, fake, grammar, field, value):
    for route in ("/generate", "/generate_stream"):
        assert http.post(route, json={"inputs": "hi", "parameters": {"grammar": grammar}}).status_code == 200
        got = getattr(fake.sent[-1], field)
        assert (json.loads(got) if field == "json_schema" else got) == value


@pytest.mark.parametrize("parameters", [
    {"grammar": {"type": "xml", "value": "<a/>"}},
    {"grammar": {"type": "regex", "value": 5}},
    {"watermark": True},
    {"n": 2},
    {"prompt_logprobs": True},
])
def test_tgi_refuses_what_it_would_not_enforce(http, fake, parameters):
    r = http.post("/generate", json={"inputs": "hi", "parameters": parameters})
    assert r.status_code == 422 and r.json()["error_type"] == "validation", r.text
    assert r.json()["error"].startswith(next(iter(parameters)))
    assert not fake.sent


def test_jina_sse_takes_the_contract_fields(http, fake):
    http.request("GET", "/stream", content=json.dumps({"prompt": "hi", "choice": ["x", "y"]}))
    assert fake.sent[-1].choice == ["x", "y"]


def test_an_engine_refusal_names_the_field_as_the_client_sent_it(http, fake):
    from gateway.edge.backend import error_doc
    fake.script = [error_doc("json_schema: does not compile: bad", ErrorKind.VALIDATION, "json_schema")]
    r = http.post("/v1/chat/completions", json={**CHAT, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format"
    assert r.json()["error"]["message"] == "response_format: does not compile: bad"
    r = http.post("/generate", json={"inputs": "hi", "parameters": {"grammar": {"type": "json", "value": {}}}})
    assert r.status_code == 422 and r.json()["error"] == "grammar: does not compile: bad"
    r = http.post("/v1/chat/completions", json={**CHAT, "json_schema": "{}"})  # the contract's own name
    assert r.json()["error"]["param"] == "json_schema"
