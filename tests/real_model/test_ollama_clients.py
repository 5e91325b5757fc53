"""Ollama's API with the trained default model, through the clients that speak it: the ollama
library (tags, show, ps, chat streamed equal to whole, generate, a JSON schema, tools) and
LangChain's ChatOllama (invoke and stream, structured output, bound tools)."""
import json
import time

import jsonschema
import ollama
import pytest
from pydantic import BaseModel

from tests.real_model.test_tool_clients import WEATHER

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = {"temperature": 0, "num_predict": 40}
# a call made once before: the small model follows the example and calls the tool again
SHOWN_A_CALL = [{"role": "user", "content": "What is the weather in Berlin?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"function": {"name": "get_weather", "arguments": {"city": "Berlin"}}}]},
                {"role": "user", "content": "What is the weather in Paris?"}]


class Country(BaseModel):
    name: str
    capital: str


@pytest.fixture(scope="module")
def client(real_flow) -> ollama.Client:
    return ollama.Client(host=f"http://127.0.0.1:{real_flow[1]}")


@pytest.fixture(scope="module")
def name(client) -> str:
    generating, embedding = client.list().models  # the chat model, then the embedding model
    assert embedding.model == "all-MiniLM-L6-v2:latest"
    return generating.model


def test_tags_show_and_ps_describe_the_default_model(client, name):
    assert name == "SmolLM2-135M-Instruct:latest"
    shown = client.show(name)
    assert shown.modelinfo["llama.context_length"] == 8192 and "tools" in shown.capabilities
    assert shown.details.parameter_size == "135M" and shown.template
    running = client.ps().models[0]
    assert running.model == name and running.context_length == 8192
    with pytest.raises(ollama.ResponseError) as refused:
        client.show("llama3.2")
    assert refused.value.status_code == 404 and name in refused.value.error


def test_chat_streamed_equals_whole_and_generate_answers_the_same(client, name):
    whole = client.chat(model=name, messages=QUESTION, options=GREEDY)
    assert whole.message.content == "The capital of France is Paris." and whole.done_reason == "stop"
    parts = list(client.chat(model=name, messages=QUESTION, options=GREEDY, stream=True))
    assert "".join(p.message.content for p in parts) == whole.message.content
    assert parts[-1].done and parts[-1].eval_count == whole.eval_count == 8
    assert parts[-1].prompt_eval_count == whole.prompt_eval_count > 0 and parts[-1].eval_duration > 0
    generated = client.generate(model=name, prompt=QUESTION[0]["content"], options=GREEDY)
    assert generated.response == whole.message.content


def test_keep_alive_0_unloads_the_model_and_the_next_request_loads_it_again(client, name):
    """`ollama stop`: an empty generate with keep_alive 0; /api/ps then lists the embedding model
    alone (loaded by its first embedding), and the next chat loads the model again (waiting for
    it) and answers as before."""
    assert len(client.embed(model="all-MiniLM-L6-v2", input="hello").embeddings[0]) == 384
    stopped = client.generate(model=name, keep_alive=0)
    assert stopped.done_reason == "unload"
    for _ in range(300):
        if name not in [m.model for m in client.ps().models]:
            break
        time.sleep(0.1)
    assert [m.model for m in client.ps().models] == ["all-MiniLM-L6-v2:latest"]
    again = client.chat(model=name, messages=QUESTION, options=GREEDY, keep_alive="10m")
    assert again.message.content == "The capital of France is Paris."
    running = client.ps().models[0]
    assert running.model == name and running.expires_at.year < 9999  # unloads 10 minutes after
    client.generate(model=name, keep_alive=-1)  # loaded for good again, for the tests that follow


def test_seeded_sampling_replays_and_logprobs_come_per_token(client, name):
    options = {"seed": 7, "num_predict": 24}
    first = client.chat(model=name, messages=QUESTION, options=options, logprobs=True, top_logprobs=2)
    again = list(client.chat(model=name, messages=QUESTION, options=options, logprobs=True, top_logprobs=2,
                             stream=True))
    assert "".join(p.message.content for p in again) == first.message.content
    streamed = [lp for p in again for lp in p.logprobs or []]
    assert [(lp.token, lp.logprob) for lp in streamed] == [(lp.token, lp.logprob) for lp in first.logprobs]
    assert len(first.logprobs) == first.eval_count and all(len(lp.top_logprobs) == 2 for lp in first.logprobs)


def test_format_with_a_json_schema(client, name):
    answer = client.chat(model=name, messages=[{"role": "user", "content": "Tell me about France."}],
                         format=Country.model_json_schema(), options=GREEDY)
    country = Country.model_validate_json(answer.message.content)
    assert country.capital == "Paris"


def test_tools_a_call_then_the_answer(client, name):
    calls = client.chat(model=name, messages=SHOWN_A_CALL, tools=[WEATHER], options=GREEDY).message.tool_calls
    assert [(c.function.name, dict(c.function.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]
    streamed = list(client.chat(model=name, messages=SHOWN_A_CALL, tools=[WEATHER], options=GREEDY, stream=True))
    assert [c for p in streamed for c in p.message.tool_calls or []] == calls
    answer = client.chat(model=name, tools=[WEATHER], options=GREEDY, messages=[
        *SHOWN_A_CALL, {"role": "assistant", "content": "", "tool_calls": [c.model_dump() for c in calls]},
        {"role": "tool", "tool_name": "get_weather", "content": json.dumps({"sky": "sunny", "temperature_c": 21})}])
    assert answer.message.content and not answer.message.tool_calls


def test_langchain_chat_ollama(real_flow, name):
    from langchain_core.tools import tool
    from langchain_ollama import ChatOllama
    llm = ChatOllama(base_url=f"http://127.0.0.1:{real_flow[1]}", model=name, temperature=0, num_predict=40)
    message = llm.invoke(QUESTION[0]["content"])
    assert message.content == "The capital of France is Paris."
    assert message.usage_metadata["output_tokens"] == 8
    assert "".join(chunk.content for chunk in llm.stream(QUESTION[0]["content"])) == message.content
    country = llm.with_structured_output(Country).invoke("Tell me about France.")
    jsonschema.validate(country.model_dump(), Country.model_json_schema())

    @tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city"""
        return "sunny"
    called = llm.bind_tools([get_weather]).invoke(
        [(m["role"] if m["role"] == "user" else "ai", m["content"]) for m in SHOWN_A_CALL[:1]]
        + [{"role": "assistant", "content": "", "tool_calls": [
            {"name": "get_weather", "args": {"city": "Berlin"}, "id": "call_0", "type": "tool_call"}]},
           ("user", SHOWN_A_CALL[-1]["content"])])
    assert [(c["name"], c["args"]) for c in called.tool_calls] == [("get_weather", {"city": "Paris"})]
