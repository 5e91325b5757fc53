"""A field a client sends is never silently ignored, on any protocol: a typo is refused before any
work with the protocol's own status (400; TGI and Jina's SSE 422), naming the field; the fields
a route declares as having no effect are accepted, and so are the neutral values of those it
refuses. And a bound's refusal states the bound that applies, under the protocol's own name."""
import json

import pytest

from contract import SamplingParams, ValidationError, request_fields
from gateway.edge.backend import error_doc
from gateway.mapping.api_fields import ApiFields, Handling
from gateway.protocols import openai_routes, tgi_routes
from gateway.protocols.ws_chat import ChatSession
from tests.gateway.fake_upstream import INFO, FakeUpstream
from tests.gateway_helpers import sse_data

CHAT = {"messages": [{"role": "user", "content": "hi"}]}
ANTHROPIC = {"max_tokens": 5, **CHAT}
OLLAMA = {"model": "fake-model:latest", **CHAT}


def refusal(r) -> tuple[int, str, object]:
    """(status, message, the field the body names where its shape has one) in any protocol's shape."""
    if r.headers["content-type"].startswith("text/event-stream"):  # Jina's SSE: the error document as one event
        event = list(sse_data(r.text.splitlines()))[0]
        return r.status_code, event["error"], event["error_field"]
    body = r.json()
    error = body["error"]
    if isinstance(error, str):  # TGI's, Ollama's
        return r.status_code, error, None
    return r.status_code, error["message"], error.get("param", None)  # OpenAI's (with param), Anthropic's


@pytest.mark.parametrize("method,path,body,status,field", [
    ("POST", "/v1/chat/completions", {**CHAT, "temprature": 0}, 400, "temprature"),
    ("POST", "/v1/completions", {"prompt": "hi", "max_token": 4}, 400, "max_token"),
    ("POST", "/v1/chat/completions", {**CHAT, "stream_options": {"include_usgae": True}}, 400,
     "stream_options.include_usgae"),
    ("POST", "/generate", {"inputs": "hi", "parameters": {"max_token": 4}}, 422, "max_token"),
    ("POST", "/generate_stream", {"inputs": "hi", "parameters": {"temprature": 0.5}}, 422, "temprature"),
    ("POST", "/", {"inputs": "hi", "parameter": {"max_new_tokens": 4}}, 422, "parameter"),
    ("POST", "/generate", {"inputs": "hi", "parameters": {"max_tokens": 4}}, 422, "max_tokens"),
    ("GET", "/stream?prompt=hi&max_token=4", None, 422, "max_token"),
    ("GET", "/stream", {"prompt": "hi", "temprature": 0}, 422, "temprature"),
    ("POST", "/v1/messages", {**ANTHROPIC, "temprature": 0}, 400, "temprature"),
    ("POST", "/v1/responses", {"input": "hi", "max_tokens": 4}, 400, "max_tokens"),
    ("POST", "/api/chat", {**OLLAMA, "option": {"temperature": 0}}, 400, "option"),
    ("POST", "/api/generate", {"model": "fake-model", "prompt": "hi", "options": {"temprature": 0}}, 400,
     "temprature"),
    ("POST", "/v1/embeddings", {"input": "hi", "dimension": 3}, 400, "dimension"),
    ("POST", "/api/embed", {"input": "hi", "truncation": False}, 400, "truncation"),
    ("POST", "/tokenize", {"prompt": "hi", "add_special_token": False}, 400, "add_special_token"),
    ("POST", "/detokenize", {"tokens": [1], "token": [2]}, 400, "token"),
    ("POST", "/api/show", {"model": "fake-model", "verbos": True}, 400, "verbos"),
    ("POST", "/api/copy", {"source": "fake-model", "destination": "x", "force": True}, 400, "force"),
])
def test_a_typo_is_refused_naming_the_field_on_every_protocol(http, fake, method, path, body, status, field):
    if method == "GET":
        r = http.request("GET", path, content=json.dumps(body) if body else None)
    else:
        r = http.post(path, json=body)
    got_status, message, param = refusal(r)
    assert got_status == status and message.startswith(f"{field}:"), r.text
    assert param in (None, field), r.text
    assert not fake.sent  # refused before any work


def test_the_refusal_suggests_the_field_the_typo_resembles(http):
    r = http.post("/v1/chat/completions", json={**CHAT, "temprature": 0})
    assert r.json()["error"] == {"message": "temprature: not a field of OpenAI's chat completions that this server "
                                            "knows; did you mean temperature?", "type": "invalid_request_error",
                                 "param": "temprature", "code": "validation"}
    r = http.post("/generate", json={"inputs": "hi", "parameters": {"max_token": 4}})
    assert r.json()["error"].endswith("did you mean max_new_tokens?")
    r = http.post("/generate", json={"inputs": "hi", "parameters": {"top_logprobs": 2}})
    assert r.json()["error"] == "top_logprobs: not supported by this server; TGI's name for it is top_n_tokens"


def test_the_websocket_chat_refuses_a_typo_naming_it():
    session = ChatSession(None, None)  # type: ignore[arg-type]
    with pytest.raises(ValueError) as refused:
        session.parse(json.dumps({"prompt": "hi", "temprature": 0}))
    assert str(refused.value) == ("temprature: not a field of the WebSocket chat's messages that this server knows; "
                                  "did you mean temperature?")
    assert session.parse(json.dumps({"prompt": "hi", "temperature": 0}))[1] == {"prompt": "hi", "temperature": 0}


def test_the_grpc_port_refuses_a_typo_as_the_routes_do():
    """The gRPC port's document is refused by the same declaration as Jina's SSE route's."""
    from docarray.proto import DocProto, NodeProto

    from gateway.edge.grpc_edge import wrong_field
    document = DocProto()
    document.data["prompt"].CopyFrom(NodeProto(text="hi"))
    assert wrong_field(document) is None
    document.data["max_token"].CopyFrom(NodeProto(integer=3))
    assert wrong_field(document) == ("max_token: not a field of PromptDocument that this server knows; "
                                     "did you mean max_tokens?")


# values for the fields the routes accept with no effect, of the types they take
NO_EFFECT_VALUES = {"user": "u-1", "metadata": {"run": "7"}, "store": False, "service_tier": "auto",
                    "safety_identifier": "s-1", "prompt_cache_key": "k", "prompt_cache_retention": "24h",
                    "prompt_cache_options": {}}
ROUTES = [("/v1/chat/completions", CHAT, openai_routes.CHAT_FIELDS),
          ("/v1/completions", {"prompt": "hi"}, openai_routes.COMPLETIONS_FIELDS)]


@pytest.mark.parametrize("path,base,declared", ROUTES, ids=["chat", "completions"])
def test_the_fields_with_no_effect_and_the_neutral_values_are_accepted(http, fake, path, base, declared: ApiFields):
    """What real clients send to any OpenAI-style server (user, metadata, store, service_tier,
    stream_options...) is accepted, every no-effect field and every neutral value at once."""
    neutral = {f.name: f.neutral[0] for f in declared.fields if f.handling is Handling.REFUSED and f.neutral}
    body = {**base, **{name: NO_EFFECT_VALUES[name] for name in declared.names(Handling.NO_EFFECT)}, **neutral,
            "stream_options": {"include_usage": True, "include_obfuscation": False}, "n": 1,
            "parallel_tool_calls": True}
    r = http.post(path, json=body)
    assert r.status_code == 200, r.text
    assert fake.sent[-1].do_sample and fake.sent[-1].n == 1  # and they changed nothing


@pytest.mark.parametrize("path,base,declared", ROUTES, ids=["chat", "completions"])
def test_every_refused_field_is_refused_naming_it(http, fake, path, base, declared: ApiFields):
    for f in declared.fields:
        if f.handling is Handling.REFUSED:
            r = http.post(path, json={**base, f.name: "something"})
            assert r.status_code == 400 and r.json()["error"]["param"] == f.name, r.text
    assert not fake.sent


def test_tgi_takes_what_its_clients_send(http, fake):
    """huggingface_hub's InferenceClient.text_generation (and TGI's own client) send each parameter
    they have, null or at its default: all are accepted, with the neutral values of those refused."""
    parameters = {"adapter_id": None, "best_of": None, "decoder_input_details": False, "details": True,
                  "do_sample": False, "frequency_penalty": None, "grammar": None, "max_new_tokens": 4,
                  "repetition_penalty": None, "return_full_text": False, "seed": None, "stop": [], "temperature": None,
                  "top_k": None, "top_n_tokens": None, "top_p": None, "truncate": None, "typical_p": None,
                  "watermark": False, "n": 1, "top_logprobs": 0, "prompt_logprobs": False, "min_p": 0.1}
    for path, extra in (("/", {"stream": False}), ("/", {"stream": True}), ("/generate", {}),
                        ("/generate_stream", {"stream": True}), ("/generate", {"add_special_tokens": True})):
        r = http.post(path, json={"inputs": "hi", "parameters": parameters, **extra})
        assert r.status_code == 200, (path, r.text)
    assert all(d.max_tokens == 4 and d.min_p == 0.1 for d in fake.sent)
    assert set(tgi_routes.PARAMETERS.names(Handling.SERVED)) >= set(parameters) - {
        f.name for f in tgi_routes.PARAMETERS.fields if f.handling is Handling.REFUSED}


@pytest.mark.parametrize("path,body,field", [
    ("/generate", {"stream": True}, "stream"), ("/generate_stream", {"stream": False}, "stream"),
    ("/generate", {"add_special_tokens": False}, "add_special_tokens"),
    ("/generate", {"parameters": {"watermark": True}}, "watermark"),
    ("/generate", {"parameters": {"n": 2}}, "n"), ("/generate", {"parameters": {"prompt_logprobs": True}}, "prompt_logprobs")])
def test_tgi_refuses_what_it_does_not_serve_naming_the_field_as_sent(http, fake, path, body, field):
    r = http.post(path, json={"inputs": "hi", **body})
    assert r.status_code == 422 and r.json()["error"].startswith(f"{field}:"), r.text
    assert not fake.sent


# ----- bounds: the message states the bound that applies, under the protocol's name -----

class Validating(FakeUpstream):
    """Refuses as the executor does: the document's fields, validated as the engine's request."""

    def refused(self, doc):
        try:
            SamplingParams(**{f.name: getattr(doc, f.name) for f in request_fields()}).validate(INFO.max_tokens_limit)
        except ValidationError as exc:
            return error_doc(str(exc), exc.kind, exc.field)
        return None

    async def open(self, doc):
        error = self.refused(doc)
        if error is not None:
            self.script = [error]
        return await super().open(doc)

    async def complete(self, doc):
        error = self.refused(doc)
        if error is not None:
            self.script = [error]
        return await super().complete(doc)


@pytest.fixture
def validating():
    from tests.gateway.fake_upstream import routes_app
    return routes_app(Validating())


LIMIT = INFO.max_tokens_limit


@pytest.mark.parametrize("path,body,message", [
    ("/v1/completions", {"prompt": "hi", "max_tokens": -1}, f"max_tokens: must be between 1 and {LIMIT}, got -1"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 0}, f"max_tokens: must be between 1 and {LIMIT}, got 0"),
    ("/v1/chat/completions", {**CHAT, "max_completion_tokens": -1},
     f"max_tokens: must be between 1 and {LIMIT}, got -1"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": LIMIT + 1},
     f"max_tokens: must be between 1 and {LIMIT}, got {LIMIT + 1}"),
    ("/generate", {"inputs": "hi", "parameters": {"max_new_tokens": -1}},
     f"max_new_tokens: must be between 1 and {LIMIT}, got -1"),
    ("/generate", {"inputs": "hi", "parameters": {"max_new_tokens": 0}},
     f"max_new_tokens: must be between 1 and {LIMIT}, got 0"),
    ("/generate", {"inputs": "hi", "parameters": {"best_of": 0}}, "best_of: must be between 1 and 16, got 0"),
    ("/generate", {"inputs": "hi", "parameters": {"top_n_tokens": 21}}, "top_n_tokens: must be between 0 and 20, got 21"),
    ("/generate", {"inputs": "hi", "parameters": {"top_p": 0}}, "top_p: must be > 0 and <= 1, got 0.0"),
    ("/v1/completions", {"prompt": "hi", "logprobs": 21}, "logprobs: must be between 0 and 20, got 21"),
    ("/v1/completions", {"prompt": "hi", "n": 0}, "n: must be between 1 and 16, got 0"),
    ("/v1/chat/completions", {**CHAT, "temperature": -1}, "temperature: must be >= 0, got -1.0"),
    ("/v1/chat/completions", {**CHAT, "presence_penalty": 3}, "presence_penalty: must be between -2 and 2, got 3.0"),
    ("/v1/responses", {"input": "hi", "max_output_tokens": -1},
     f"max_output_tokens: must be between 1 and {LIMIT}, got -1"),
    ("/v1/messages", {**ANTHROPIC, "max_tokens": -1}, f"max_tokens: must be between 1 and {LIMIT}, got -1"),
    ("/api/chat", {**OLLAMA, "options": {"num_predict": 0}},
     f"num_predict: must be -1, -2 or between 1 and {LIMIT}, got 0"),
    ("/api/chat", {**OLLAMA, "options": {"num_predict": -3}},
     f"num_predict: must be -1, -2 or between 1 and {LIMIT}, got -3"),
    ("/api/chat", {**OLLAMA, "options": {"num_predict": LIMIT + 1}},
     f"num_predict: must be between 1 and {LIMIT}, got {LIMIT + 1}"),
])
def test_a_bounds_message_states_the_bound_that_applies(validating, path, body, message):
    _, got, _ = refusal(validating.post(path, json=body))
    assert got == message


def test_max_tokens_zero_scores_a_prompt_when_asked_to(validating):
    r = validating.post("/v1/completions", json={"prompt": "hi", "max_tokens": 0, "echo": True})
    assert r.status_code == 200, r.text
