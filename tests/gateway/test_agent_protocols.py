"""Anthropic's Messages, OpenAI's Responses and the token routes against a scripted executor:
each request onto the contract's fields (the engine's conversation, tools, constraints), each
answer and stream in the protocol's own shape, what is not served refused naming the field."""
import json

import pytest

from contract import ErrorKind
from gateway.edge.backend import error_doc
from schemas import ModelOutputDocument
from tests.gateway.fake_upstream import tokens

WEATHER_ANTHROPIC = {"name": "get_weather", "description": "The weather in a city",
                     "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}


def events(text: str) -> list[tuple[str, dict]]:
    """Server-sent events as (event, data)."""
    out, name = [], None
    for line in text.splitlines():
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            out.append((name, json.loads(line[6:])))
    return out


def calling(arguments: str = '{"city":"Paris"}') -> list[ModelOutputDocument]:
    """An answer that calls get_weather, its arguments in two pieces."""
    first, second = arguments[:5], arguments[5:]
    return [ModelOutputDocument(token_ids=[1], texts=[""], index=0, tool_call_indexes=[0, 0],
                                tool_call_ids=["call_1", ""], tool_call_names=["get_weather", ""],
                                tool_call_arguments=["", first], prompt_tokens=9, cached_tokens=4),
            ModelOutputDocument(token_ids=[2], texts=[""], index=1, tool_call_indexes=[0], tool_call_ids=[""],
                                tool_call_names=[""], tool_call_arguments=[second], finish_reason="tool_calls",
                                generated_tokens=2, prompt_tokens=9, cached_tokens=4)]


# ----- Anthropic Messages -----

def test_a_messages_request_becomes_the_engines_conversation(http, fake):
    body = {"max_tokens": 20, "system": [{"type": "text", "text": "Be brief.",
                                                               "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": "Weather?"},
                         {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                                            "input": {"city": "Paris"}}]},
                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                                       "content": "sunny"}, {"type": "text", "text": "Thanks"}]}],
            "stop_sequences": ["END"], "temperature": 0.5, "top_k": 7, "tools": [WEATHER_ANTHROPIC],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": True}, "metadata": {"user_id": "u"}}
    r = http.post("/v1/messages", json=body)
    assert r.status_code == 200, r.text
    doc = fake.sent[-1]
    assert json.loads(doc.messages) == [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "toolu_1", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"}, {"role": "user", "content": "Thanks"}]
    assert (doc.max_tokens, doc.stop, doc.temperature, doc.top_k, doc.do_sample) == (20, ["END"], 0.5, 7, True)
    assert doc.tool_choice == "required" and doc.parallel_tool_calls is False
    assert json.loads(doc.tools)[0]["function"]["parameters"] == WEATHER_ANTHROPIC["input_schema"]
    answer = r.json()
    assert answer["type"] == "message" and answer["role"] == "assistant" and answer["model"] == "fake-model"
    assert answer["content"] == [{"type": "text", "text": "Hello world"}] and answer["stop_reason"] == "max_tokens"
    assert answer["usage"]["input_tokens"] == 3 and answer["usage"]["output_tokens"] == 2


def test_a_messages_stream_is_anthropics_events_and_joins_to_the_answer(http, fake):
    fake.script = calling()
    whole = http.post("/v1/messages", json={"max_tokens": 20, "messages": [{"role": "user", "content": "w?"}],
                                            "tools": [WEATHER_ANTHROPIC]}).json()
    assert whole["content"] == [{"type": "tool_use", "id": "call_1", "name": "get_weather",
                                 "input": {"city": "Paris"}}] and whole["stop_reason"] == "tool_use"
    assert whole["usage"] == {"input_tokens": 5, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 4,
                              "output_tokens": 2}
    r = http.post("/v1/messages", json={"max_tokens": 20, "messages": [{"role": "user", "content": "w?"}],
                                        "tools": [WEATHER_ANTHROPIC], "stream": True})
    got = events(r.text)
    assert [name for name, _ in got] == ["message_start", "ping", "content_block_start", "content_block_delta",
                                         "content_block_delta", "content_block_stop", "message_delta", "message_stop"]
    assert all(data["type"] == name for name, data in got)
    assert got[0][1]["message"]["usage"]["input_tokens"] == 5
    assert got[2][1]["content_block"] == {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {}}
    streamed = "".join(d["delta"]["partial_json"] for n, d in got if n == "content_block_delta")
    assert json.loads(streamed) == whole["content"][0]["input"]
    assert got[-2][1]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}


def test_a_stop_sequence_is_named(http, fake):
    fake.script = tokens("Hi", finish="stop_sequence")
    fake.script[-1].stop_sequence = "END"
    answer = http.post("/v1/messages", json={"max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
                                             "stop_sequences": ["END"]}).json()
    assert answer["stop_reason"] == "stop_sequence" and answer["stop_sequence"] == "END"


@pytest.mark.parametrize("body,field", [
    ({"messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
    ({"max_tokens": 5, "thinking": {"type": "enabled", "budget_tokens": -1},
      "messages": [{"role": "user", "content": "x"}]}, "thinking"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "messages"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
      "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "maybe"}},
     "tool_choice"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "The"}]},
     "messages"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "speed": "fast"}, "speed"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "top_q": 0.5}, "top_q"),
])
def test_what_messages_does_not_serve_is_refused_in_anthropics_shape(http, fake, body, field):
    r = http.post("/v1/messages", json=body)
    assert r.status_code == 400 and r.json()["type"] == "error", r.text
    assert r.json()["error"]["type"] == "invalid_request_error" and r.json()["error"]["message"].startswith(field)
    assert not fake.sent


def test_messages_refusals_from_the_engine_keep_their_kind(http, fake):
    fake.script = [error_doc("overloaded: retry later", ErrorKind.OVERLOADED)]
    r = http.post("/v1/messages", json={"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 529 and r.json()["error"]["type"] == "overloaded_error"


def test_count_tokens_counts_the_rendered_prompt(http, fake):
    r = http.post("/v1/messages/count_tokens", json={"messages": [{"role": "user", "content": "hey"}],
                                                     "tools": [WEATHER_ANTHROPIC]})
    assert r.status_code == 200 and r.json() == {"input_tokens": len(fake.sent[-1].messages)}
    assert json.loads(fake.sent[-1].tools)[0]["function"]["name"] == "get_weather"
    r = http.post("/v1/messages/count_tokens", json={"messages": [{"role": "user", "content": "hey"}],
                                                     "output_config": {"effort": "extreme"}})
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("output_config"), r.text


def test_fields_with_no_effect_are_accepted(http, fake):
    fake.script = [ModelOutputDocument(text="Hi", generated_text="Hi", finish_reason="eos_token")]
    r = http.post("/v1/messages", json={"max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
                                        "metadata": {"user_id": "u"}, "cache_control": {"type": "ephemeral"},
                                        "service_tier": "auto", "thinking": {"type": "disabled"}})
    assert r.status_code == 200, r.text
    fake.script = [ModelOutputDocument(text="Hi", generated_text="Hi", finish_reason="eos_token")]
    r = http.post("/v1/responses", json={"input": "x", "store": False, "prompt_cache_key": "k", "user": "u",
                                         "truncation": "auto", "text": {"verbosity": "medium"}})
    assert r.status_code == 200 and r.json()["truncation"] == "auto", r.text


# ----- OpenAI Responses -----

def test_a_responses_request_becomes_the_engines_conversation(http, fake):
    body = {"instructions": "Be brief.", "max_output_tokens": 30, "temperature": 0.3,
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
                      {"type": "function_call", "call_id": "call_9", "name": "get_weather",
                       "arguments": '{"city":"Rome"}'},
                      {"type": "function_call_output", "call_id": "call_9", "output": "rain"}],
            "tools": [{"type": "function", "name": "get_weather", "parameters": WEATHER_ANTHROPIC["input_schema"]}],
            "tool_choice": {"type": "function", "name": "get_weather"}, "store": False}
    r = http.post("/v1/responses", json=body)
    assert r.status_code == 200, r.text
    doc = fake.sent[-1]
    assert json.loads(doc.messages) == [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "call_9", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city":"Rome"}'}}]},
        {"role": "tool", "tool_call_id": "call_9", "content": "rain"}]
    assert (doc.max_tokens, doc.temperature, doc.tool_choice) == (30, 0.3, "get_weather")
    answer = r.json()
    assert answer["object"] == "response" and answer["status"] == "incomplete"  # length
    assert answer["output"][0]["content"][0]["text"] == "Hello world"
    assert answer["usage"]["input_tokens"] == 3 and answer["usage"]["output_tokens"] == 2


def test_a_responses_stream_joins_to_the_answer(http, fake):
    fake.script = calling()
    whole = http.post("/v1/responses", json={"input": "w?", "tools": [
        {"type": "function", "name": "get_weather", "parameters": {}}]}).json()
    (call,) = whole["output"]
    assert call["type"] == "function_call" and call["call_id"] == "call_1" and json.loads(call["arguments"])
    r = http.post("/v1/responses", json={"input": "w?", "stream": True, "tools": [
        {"type": "function", "name": "get_weather", "parameters": {}}]})
    got = events(r.text)
    names = [name for name, _ in got]
    assert names[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert names[-2:] == ["response.output_item.done", "response.completed"]
    assert [d["sequence_number"] for _, d in got] == list(range(len(got)))
    deltas = "".join(d["delta"] for n, d in got if n == "response.function_call_arguments.delta")
    assert deltas == call["arguments"] == got[-1][1]["response"]["output"][0]["arguments"]


def test_text_format_is_structured_output(http, fake):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    http.post("/v1/responses", json={"input": "x", "text": {"format": {"type": "json_schema", "name": "a",
                                                                       "schema": schema}}})
    assert json.loads(fake.sent[-1].json_schema) == schema
    http.post("/v1/responses", json={"input": "x", "text": {"format": {"type": "json_object"}}})
    assert fake.sent[-1].json_object is True


@pytest.mark.parametrize("field,value", [("store", True), ("previous_response_id", "resp_1"),
                                         ("reasoning", {"summary": "auto"}), ("include", ["file_search_call.results"]),
                                         ("truncation", "disabled"), ("text", {"verbosity": "low"}),
                                         ("max_completion_tokens", 5)])
def test_what_responses_does_not_serve_is_refused_naming_the_field(http, fake, field, value):
    r = http.post("/v1/responses", json={"input": "x", field: value})
    assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
    assert not fake.sent


# ----- tokens -----

def test_tokenize_and_detokenize_in_vllms_shapes(http, fake):
    r = http.post("/tokenize", json={"prompt": "ab"})
    assert r.json() == {"count": 2, "max_model_len": 512, "tokens": [97, 98], "token_strs": None}
    r = http.post("/tokenize", json={"messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200 and json.loads(fake.sent[-1].messages)[0]["content"] == "hi"
    assert http.post("/detokenize", json={"tokens": [104, 105]}).json() == {"prompt": "hi"}
    r = http.post("/tokenize", json={"prompt": "ab", "add_special_tokens": False})
    assert r.status_code == 400 and r.json()["error"]["param"] == "add_special_tokens"


def test_a_completions_prompt_of_token_ids(http, fake):
    for prompt in ([5, 6, 7], [[5, 6, 7]]):
        assert http.post("/v1/completions", json={"prompt": prompt}).status_code == 200
        assert fake.sent[-1].prompt_token_ids == [5, 6, 7] and fake.sent[-1].prompt == ""
    r = http.post("/v1/completions", json={"prompt": [[1], [2]]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
