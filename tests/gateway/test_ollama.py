"""Ollama's API against a scripted executor: the model routes' shapes, each chat and generate
request onto the contract's fields, streamed lines that join to the whole answer, and what is not
served refused naming the field, in Ollama's error shape."""
import json

import pytest

from contract import ErrorKind
from gateway.edge.backend import error_doc
from tests.gateway.fake_upstream import tokens
from tests.gateway.test_agent_protocols import calling

NAME = "fake-model:latest"
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}


def lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


def spelled(*texts: str, finish: str = "length") -> list:
    """A scripted answer whose tokens carry their own text, as when logprobs are asked."""
    docs = tokens(*texts, finish=finish)
    for doc in docs:
        doc.tokens = list(doc.texts)
    return docs


def chat(http, **body):
    return http.post("/api/chat", json={"model": NAME, "messages": [{"role": "user", "content": "hi"}], **body})


def test_the_model_routes_describe_the_served_model(http):
    assert http.get("/api/version").json()["version"]
    listed, embedder = http.get("/api/tags").json()["models"]
    assert listed["name"] == listed["model"] == NAME and listed["details"]["family"] == "llama"
    assert listed["details"]["parameter_size"] == "135M" and listed["size"] == 90_000_000
    assert embedder["name"] == "fake-embedder:latest" and embedder["details"]["parameter_size"] == "22M"
    running, _ = http.get("/api/ps").json()["models"]
    assert running["context_length"] == 512 and running["expires_at"].startswith("9999")
    shown = http.post("/api/show", json={"model": "fake-model"}).json()
    assert shown["model_info"]["llama.context_length"] == 512
    assert shown["capabilities"] == ["completion", "tools"]
    shown = http.post("/api/show", json={"model": "fake-embedder"}).json()
    assert shown["capabilities"] == ["embedding"] and shown["model_info"]["bert.embedding_length"] == 3


def test_without_an_embedding_model_one_model_is_listed(http, fake):
    fake.embedding = None
    assert [m["name"] for m in http.get("/api/tags").json()["models"]] == [NAME]


def test_vs_code_copilots_discovery_finds_a_model_it_can_chat_with(http):
    """Copilot's Ollama provider: /api/version at least 0.6.4, the ids from /api/tags, each one's
    context and tools from /api/show, then OpenAI chat at /v1 under that id."""
    assert tuple(int(p) for p in http.get("/api/version").json()["version"].split(".")) >= (0, 6, 4)
    model = http.get("/api/tags").json()["models"][0]["model"]
    info = http.post("/api/show", json={"model": model}).json()
    assert info["model_info"][f"{info['model_info']['general.architecture']}.context_length"] == 512
    assert "tools" in info["capabilities"] and info["model_info"]["general.basename"] == "fake-model"
    r = http.post("/v1/chat/completions", json={"model": model, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "Hello world"


@pytest.mark.parametrize("method,path,body", [
    ("post", "/api/show", {"model": "gpt-4o"}), ("post", "/api/chat", {"model": "gpt-4o", "messages": []}),
    ("post", "/api/generate", {"model": "gpt-4o", "prompt": "hi"}), ("post", "/api/pull", {"model": "gpt-4o"}),
    ("delete", "/api/delete", {"model": "gpt-4o"}), ("post", "/api/copy", {"source": NAME, "destination": "gpt-4o"})])
def test_a_model_not_served_gets_404_naming_the_served_one(http, method, path, body):
    r = http.request(method.upper(), path, json=body)
    assert r.status_code == 404, r.text
    assert "gpt-4o" in r.json()["error"] and NAME in r.json()["error"]


def test_pull_delete_and_copy_succeed_for_the_served_model(http):
    assert lines(http.post("/api/pull", json={"model": NAME}).text) == [{"status": "success"}]
    assert http.post("/api/pull", json={"model": NAME, "stream": False}).json() == {"status": "success"}
    assert http.request("DELETE", "/api/delete", json={"model": NAME}).status_code == 200
    assert http.post("/api/copy", json={"source": "fake-model", "destination": NAME}).status_code == 200


def test_a_chat_request_becomes_the_engines_conversation_and_fields(http, fake):
    body = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"},
                         {"role": "assistant", "content": "", "tool_calls": [
                             {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
                         {"role": "tool", "content": "sunny", "tool_name": "get_weather"}],
            "tools": [WEATHER], "format": {"type": "object"}, "keep_alive": "10m", "logprobs": True, "top_logprobs": 2,
            "options": {"num_predict": 7, "temperature": 0.5, "top_k": 3, "top_p": 0.8, "min_p": 0.1, "seed": 9,
                        "stop": ["END"], "repeat_penalty": 1.2, "repeat_last_n": -1, "num_thread": 2}}
    fake.script = spelled("Hello")
    assert chat(http, **body).status_code == 200
    doc = fake.sent[-1]
    assert json.loads(doc.messages) == [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "call_2_0", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "get_weather", "content": "sunny"}]
    assert (doc.max_tokens, doc.temperature, doc.top_k, doc.top_p, doc.min_p, doc.seed, doc.stop) == (
        7, 0.5, 3, 0.8, 0.1, 9, ["END"])
    assert (doc.repetition_penalty, doc.json_schema, doc.logprobs, doc.top_logprobs) == (1.2, '{"type": "object"}', True, 2)
    assert json.loads(doc.tools)[0]["function"]["name"] == "get_weather"


def test_ollamas_defaults_sample_and_json_format_is_a_json_object(http, fake):
    assert chat(http, format="json").status_code == 200
    doc = fake.sent[-1]
    assert (doc.do_sample, doc.temperature, doc.top_k, doc.top_p, doc.json_object) == (True, 0.8, 40, 0.9, True)
    assert doc.max_tokens == 100  # num_predict -1 by default: min(max_tokens_limit, context / 2)
    assert chat(http, options={"seed": -1, "num_predict": -2}).status_code == 200
    assert fake.sent[-1].seed is None and fake.sent[-1].max_tokens == 100


def test_num_ctx_below_the_context_bounds_prompt_and_answer(http, fake):
    assert chat(http, options={"num_ctx": 200, "num_predict": 500}).status_code == 200  # 500 > the limit, but...
    prompt = len(fake.sent[-2].messages)  # the fake tokenizer: a token a character
    assert fake.sent[-1].max_tokens == 200 - prompt
    r = chat(http, options={"num_ctx": 10})
    assert r.status_code == 400 and r.json()["error"].startswith("num_ctx: the prompt takes")
    assert chat(http, options={"num_ctx": 4096}).status_code == 200 and fake.sent[-1].max_tokens == 100


def test_streamed_lines_join_to_the_whole_answer(http, fake):
    fake.script = spelled("Hello", " world", finish="eos_token")
    streamed = lines(chat(http, logprobs=True).text)
    whole = chat(http, logprobs=True, stream=False).json()
    assert [line["done"] for line in streamed] == [False, False, True]
    assert "".join(line["message"]["content"] for line in streamed) == whole["message"]["content"] == "Hello world"
    assert [lp for line in streamed for lp in line.get("logprobs", [])] == whole["logprobs"]
    last = streamed[-1]
    assert (last["done_reason"], last["prompt_eval_count"], last["eval_count"]) == ("stop", 3, 2)
    assert last["total_duration"] >= last["prompt_eval_duration"] + last["eval_duration"] - 1
    assert whole["done_reason"] == "stop" and whole["model"] == NAME
    assert last["load_duration"] == whole["load_duration"] == 0  # the model was loaded


def test_load_duration_is_the_requests_wait_for_its_model_to_load(http, fake):
    """The executor tells how long a request waited for its model's load (load_seconds), and
    Ollama's final line gives it, apart from the prompt's evaluation."""
    fake.script = tokens("Hello", " world")
    for doc in fake.script:
        doc.load_seconds = 1.5
    for answer in (lines(chat(http).text)[-1], chat(http, stream=False).json()):
        assert answer["load_duration"] == 1_500_000_000
        assert answer["total_duration"] >= answer["prompt_eval_duration"] + answer["eval_duration"] - 1


def test_tool_calls_come_whole_with_their_arguments_as_an_object(http, fake):
    fake.script = calling()
    streamed = lines(chat(http, tools=[WEATHER]).text)
    call = {"function": {"index": 0, "name": "get_weather", "arguments": {"city": "Paris"}}}
    assert streamed[-2]["message"]["tool_calls"] == [call] and streamed[-1]["done"] is True
    assert chat(http, tools=[WEATHER], stream=False).json()["message"]["tool_calls"] == [call]


def test_generate_renders_the_prompt_as_a_user_turn_unless_raw(http, fake):
    r = http.post("/api/generate", json={"model": NAME, "prompt": "hi", "system": "Be brief.", "stream": False})
    assert r.json()["response"] == "Hello world" and r.json()["done"] is True
    assert json.loads(fake.sent[-1].messages) == [{"role": "system", "content": "Be brief."},
                                                  {"role": "user", "content": "hi"}]
    streamed = lines(http.post("/api/generate", json={"model": NAME, "prompt": "hi", "raw": True}).text)
    assert "".join(line["response"] for line in streamed) == "Hello world" and fake.sent[-1].prompt == "hi"
    r = http.post("/api/generate", json={"model": NAME, "prompt": "hi", "raw": True, "system": "x"})
    assert r.status_code == 400 and r.json()["error"].startswith("system:")


def test_an_empty_request_loads_the_model(http, fake):
    sent = len(fake.sent)
    assert http.post("/api/chat", json={"model": NAME, "messages": []}).json()["done_reason"] == "load"
    assert http.post("/api/generate", json={"model": NAME}).json()["done_reason"] == "load"
    assert len(fake.sent) == sent  # nothing generated


@pytest.mark.parametrize("body,field", [
    ({"think": "deep"}, "think"), ({"bogus": 1}, "bogus"),
    ({"keep_alive": "soon"}, "keep_alive"), ({"format": "xml"}, "format"), ({"top_logprobs": 3}, "top_logprobs"),
    ({"options": {"mirostat": 2}}, "mirostat"), ({"options": {"tfs_z": 0.5}}, "tfs_z"),
    ({"options": {"num_predict": -3}}, "num_predict"), ({"options": {"temperature": "hot"}}, "options.temperature"),
    ({"options": {"repeat_penalty": 1.1, "repeat_last_n": 64}}, "repeat_last_n"),
    ({"options": {"frobnicate": 1}}, "frobnicate"),
    ({"messages": [{"role": "user", "content": "hi", "images": ["aGk="]}]}, "messages.0.images"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "messages.0.role")])
def test_what_is_not_served_is_refused_naming_the_field(http, fake, body, field):
    sent = len(fake.sent)
    r = chat(http, **body)
    assert r.status_code == 400, r.text
    assert r.json()["error"].startswith(field), r.json()
    assert len(fake.sent) == sent


def test_the_executors_refusal_names_ollamas_field_and_a_late_error_is_a_line(http, fake):
    fake.script = [error_doc("max_tokens: must be between 1 and 100, got 500", ErrorKind.VALIDATION, "max_tokens")]
    r = chat(http, options={"num_predict": 500})
    assert r.status_code == 400 and r.json() == {"error": "num_predict: must be between 1 and 100, got 500"}
    fake.script = [*tokens("Hel", "lo")[:1], error_doc("engine died")]
    assert lines(chat(http).text)[-1] == {"error": "engine died"}
    fake.script = [error_doc("overloaded: retry later", ErrorKind.OVERLOADED)]
    assert chat(http).status_code == 503
