"""OpenAI tool calls through the gateway: tools and tool_choice onto the document, and the
documents' call parts onto message.tool_calls and delta.tool_calls, equal whatever the chunking."""
import json

import pytest

from schemas import ModelOutputDocument
from tests.gateway_helpers import sse_data

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
CHAT = {"messages": [{"role": "user", "content": "weather in Paris?"}], "tools": TOOLS}


@pytest.mark.parametrize(("choice", "sent"), [
    (None, None), ("auto", "auto"), ("required", "required"), ("none", "none"),
    ({"type": "function", "function": {"name": "get_weather"}}, "get_weather")])
def test_tools_and_tool_choice_reach_the_document(http, fake, choice, sent):
    body = {**CHAT, **({} if choice is None else {"tool_choice": choice}), "parallel_tool_calls": False}
    assert http.post("/v1/chat/completions", json=body).status_code == 200
    doc = fake.sent[-1]
    assert json.loads(doc.tools) == TOOLS and doc.tool_choice == sent and doc.parallel_tool_calls is False


def test_a_malformed_tool_choice_is_refused(http, fake):
    r = http.post("/v1/chat/completions", json={**CHAT, "tool_choice": {"type": "function"}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"
    assert not fake.sent


def call_docs(chunks: list[list[tuple]]) -> list[ModelOutputDocument]:
    """Documents carrying call parts (index, id, name, arguments), chunked as given."""
    docs = []
    for i, parts in enumerate(chunks):
        last = i == len(chunks) - 1
        docs.append(ModelOutputDocument(
            token_ids=[i], texts=[""], logprobs=[0.0], specials=[False], index=i,
            tool_call_indexes=[p[0] for p in parts], tool_call_ids=[p[1] for p in parts],
            tool_call_names=[p[2] for p in parts], tool_call_arguments=[p[3] for p in parts],
            finish_reason="tool_calls" if last else None, generated_tokens=len(chunks) if last else None,
            prompt_tokens=3 if last else None))
    return docs


FIRST, SECOND = (0, "call_0", "get_weather", ""), (1, "call_1", "get_weather", "")
ONE_BY_ONE = [[FIRST], [(0, "", "", '{"city"')], [(0, "", "", ':"Par')], [(0, "", "", 'is"}')], [SECOND],
              [(1, "", "", '{"city":"Rome"}')]]
COALESCED = [[FIRST, (0, "", "", '{"city"'), (0, "", "", ':"Par')], [(0, "", "", 'is"}'), SECOND,
                                                                      (1, "", "", '{"city":"Ro')],
             [(1, "", "", 'me"}')]]


@pytest.mark.parametrize("chunks", [ONE_BY_ONE, COALESCED], ids=["one-by-one", "coalesced"])
def test_streamed_calls_join_to_the_whole_answers_calls(http, fake, chunks):
    fake.script = call_docs(chunks)
    whole = http.post("/v1/chat/completions", json=CHAT).json()["choices"][0]
    assert whole["finish_reason"] == "tool_calls" and whole["message"]["content"] is None
    calls = whole["message"]["tool_calls"]
    assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in calls] == [
        ("call_0", "get_weather", '{"city":"Paris"}'), ("call_1", "get_weather", '{"city":"Rome"}')]
    r = http.post("/v1/chat/completions", json={**CHAT, "stream": True})
    events = [e for e in sse_data(r.text.splitlines()) if e != "[DONE]"]
    joined: dict[int, dict] = {}
    for event in events:
        for part in event["choices"][0]["delta"].get("tool_calls", []):
            call = joined.setdefault(part["index"], {"id": None, "name": None, "arguments": ""})
            call["id"] = part.get("id", call["id"])
            call["name"] = part.get("function", {}).get("name", call["name"])
            call["arguments"] += part["function"]["arguments"]
    assert [(c["id"], c["name"], c["arguments"]) for c in joined.values()] == [
        (c["id"], c["function"]["name"], c["function"]["arguments"]) for c in calls]
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"
