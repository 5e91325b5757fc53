"""A reasoning model's thoughts (the documents' `reasoning`) on every protocol, apart from the
answer, whole and streamed; and each protocol's way to bound them (a reasoning_budget)."""
import json

import pytest

from schemas import ModelOutputDocument
from tests.gateway_helpers import sse_data

HI = [{"role": "user", "content": "hi"}]
THOUGHTS, ANSWER = "Let me think. France's capital.", "Paris."


def thinking_script() -> list[ModelOutputDocument]:
    parts = [("Let me think.", ""), (" France's capital.", ""), ("", "Par"), ("", "is.")]
    docs = [ModelOutputDocument(token_ids=[i], texts=[text], text=text, reasoning=thought, index=i, logprobs=[-0.1])
            for i, (thought, text) in enumerate(parts)]
    docs[-1] = docs[-1].model_copy(update={"finish_reason": "eos_token", "generated_tokens": 4, "prompt_tokens": 3,
                                           "reasoning_tokens": 2})
    return docs


@pytest.fixture
def thinking(fake):
    fake.script = thinking_script()
    return fake


def _events(response) -> list:
    return list(sse_data(response.iter_lines()))


def test_openai_chat_has_the_thoughts_apart_whole_and_streamed(http, thinking):
    whole = http.post("/v1/chat/completions", json={"messages": HI}).json()
    assert whole["usage"]["completion_tokens_details"] == {"reasoning_tokens": 2}
    message = whole["choices"][0]["message"]
    assert (message["content"], message["reasoning"], message["reasoning_content"]) == (ANSWER, THOUGHTS, THOUGHTS)
    with http.stream("POST", "/v1/chat/completions", json={"messages": HI, "stream": True}) as r:
        deltas = [e["choices"][0]["delta"] for e in _events(r) if isinstance(e, dict) and e["choices"]]
    assert "".join(d.get("reasoning", "") for d in deltas) == "".join(d.get("reasoning_content", "") for d in deltas) \
        == THOUGHTS
    assert "".join(d.get("content") or "" for d in deltas) == ANSWER
    completion = http.post("/v1/completions", json={"prompt": "hi"}).json()["choices"][0]
    assert (completion["text"], completion["reasoning"]) == (ANSWER, THOUGHTS)


@pytest.mark.parametrize("route,body,budget", [
    ("/v1/chat/completions", {"messages": HI, "reasoning_effort": "low"}, 1024),
    ("/v1/chat/completions", {"messages": HI, "reasoning_effort": "none"}, 0),
    ("/v1/chat/completions", {"messages": HI, "reasoning_budget": 7}, 7),
    ("/v1/messages", {"max_tokens": 9, "messages": HI, "thinking": {"type": "enabled", "budget_tokens": 50}}, 50),
    ("/v1/messages", {"max_tokens": 9, "messages": HI, "thinking": {"type": "disabled"}}, 0),
    ("/v1/messages", {"max_tokens": 9, "messages": HI, "output_config": {"effort": "medium"}}, 4096),
    ("/v1/responses", {"input": "hi", "reasoning": {"effort": "minimal"}}, 256),
    ("/api/chat", {"model": "fake-model", "messages": HI, "stream": False, "think": False}, 0),
    ("/api/chat", {"model": "fake-model", "messages": HI, "stream": False, "think": "high"}, None),
    ("/api/generate", {"model": "fake-model", "prompt": "hi", "stream": False, "think": True}, None),
])
def test_each_protocols_bound_becomes_the_budget(http, thinking, route, body, budget):
    r = http.post(route, json=body)
    assert r.status_code == 200, r.text
    assert thinking.sent[-1].reasoning_budget == budget


@pytest.mark.parametrize("route,body,field", [
    ("/v1/chat/completions", {"messages": HI, "reasoning_effort": "extreme"}, "reasoning_effort"),
    ("/v1/messages", {"max_tokens": 9, "messages": HI, "thinking": {"type": "enabled"}}, "thinking"),
    ("/v1/responses", {"input": "hi", "reasoning": {"summary": "auto"}}, "reasoning"),
    ("/api/chat", {"model": "fake-model", "messages": HI, "think": "deep"}, "think"),
])
def test_a_bound_not_served_is_refused_naming_its_field(http, thinking, route, body, field):
    r = http.post(route, json=body)
    assert r.status_code == 400 and field in r.text, r.text
    assert not thinking.sent


def test_anthropic_has_a_thinking_block_before_the_text(http, thinking):
    body = {"max_tokens": 9, "messages": HI}
    content = http.post("/v1/messages", json=body).json()["content"]
    assert content == [{"type": "thinking", "thinking": THOUGHTS, "signature": ""}, {"type": "text", "text": ANSWER}]
    with http.stream("POST", "/v1/messages", json={**body, "stream": True}) as r:
        events = _events(r)
    starts = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
    deltas = [e["delta"] for e in events if e["type"] == "content_block_delta"]
    assert starts == ["thinking", "text"]
    assert "".join(d.get("thinking", "") for d in deltas) == THOUGHTS and "".join(d.get("text", "") for d in deltas) \
        == ANSWER
    again = {**body, "messages": [*HI, {"role": "assistant", "content": content}, {"role": "user", "content": "ok"}]}
    assert http.post("/v1/messages", json=again).status_code == 200  # past thoughts are taken, and go no further
    assert "Let me think" not in thinking.sent[-1].messages


def test_responses_has_a_reasoning_item_before_the_message(http, thinking):
    response = http.post("/v1/responses", json={"input": "hi"}).json()
    assert response["usage"]["output_tokens_details"] == {"reasoning_tokens": 2}
    output = response["output"]
    assert [item["type"] for item in output] == ["reasoning", "message"]
    assert output[0]["content"] == [{"type": "reasoning_text", "text": THOUGHTS}]
    assert output[1]["content"][0]["text"] == ANSWER
    with http.stream("POST", "/v1/responses", json={"input": "hi", "stream": True}) as r:
        events = _events(r)
    assert "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta") == THOUGHTS
    assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == ANSWER
    assert [e["item"]["type"] for e in events if e["type"] == "response.output_item.done"] == ["reasoning", "message"]
    again = [{"role": "user", "content": "hi"}, *output, {"role": "user", "content": "ok"}]
    assert http.post("/v1/responses", json={"input": again}).status_code == 200


def test_ollama_has_thinking_apart(http, thinking):
    whole = http.post("/api/chat", json={"model": "fake-model", "messages": HI, "stream": False}).json()
    assert (whole["message"]["content"], whole["message"]["thinking"]) == (ANSWER, THOUGHTS)
    lines = [json.loads(line) for line in http.post("/api/chat", json={"model": "fake-model", "messages": HI})
             .text.splitlines()]
    assert "".join(m["message"].get("thinking", "") for m in lines) == THOUGHTS
    assert "".join(m["message"]["content"] for m in lines) == ANSWER
    generated = http.post("/api/generate", json={"model": "fake-model", "prompt": "hi", "stream": False}).json()
    assert (generated["response"], generated["thinking"]) == (ANSWER, THOUGHTS)
    history = [*HI, {"role": "assistant", "content": ANSWER, "thinking": THOUGHTS}, {"role": "user", "content": "ok"}]
    assert http.post("/api/chat", json={"model": "fake-model", "messages": history, "stream": False}).status_code == 200
