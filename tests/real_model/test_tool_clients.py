"""Tool calls with the trained default model, through the clients agent frameworks are built
on: the openai SDK (streamed equal to non-streamed), LangChain's bind_tools and
with_structured_output(function_calling), instructor's TOOLS mode and pydantic-ai's output_type;
and a whole round trip: a call, its result, then the answer."""
import json
import os
import subprocess

import jsonschema
import openai
import pytest
from pydantic import BaseModel

from tests.conftest import ROOT
from tests.real_model.test_real_model import user

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two numbers",
    "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                   "required": ["a", "b"]}}}
QUESTION = "What is the weather in Paris?"


class Person(BaseModel):
    name: str
    age: int


def api(port: int) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)


def streamed_calls(client: openai.OpenAI, **kw) -> tuple[list[tuple], str]:
    calls: dict[int, list] = {}
    finish = ""
    for chunk in client.chat.completions.create(stream=True, **kw):
        for part in chunk.choices[0].delta.tool_calls or []:
            call = calls.setdefault(part.index, [None, ""])
            call[0] = part.function.name or call[0]
            call[1] += part.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    return [tuple(c) for c in calls.values()], finish


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
@pytest.mark.parametrize("interval", [1, 4])
def test_openai_sdk_calls_streamed_equal_to_whole(real_flow, tool_choice, interval):
    client = api(real_flow[1])
    kw = dict(model="SmolLM2-135M-Instruct", messages=user(QUESTION), tools=[WEATHER, ADD], tool_choice=tool_choice, temperature=0,
              max_tokens=80, extra_body={"stream_interval": interval})
    whole = client.chat.completions.create(**kw).choices[0]
    assert whole.finish_reason == "tool_calls" and whole.message.content is None
    calls = [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]
    assert calls and all(name == "get_weather" for name, _ in calls)
    for _, arguments in calls:
        jsonschema.validate(json.loads(arguments), WEATHER["function"]["parameters"])
    assert len({c.id for c in whole.message.tool_calls}) == len(calls)  # ids unique per call
    assert streamed_calls(client, **kw) == (calls, "tool_calls")


def test_tool_choice_none_and_auto_may_answer_in_text(real_flow):
    client = api(real_flow[1])
    for choice in ("none", "auto"):
        answer = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=user("Tell me a joke."), tools=[WEATHER],
                                                tool_choice=choice, temperature=0, max_tokens=40).choices[0]
        assert answer.message.content and not answer.message.tool_calls


def test_a_round_trip_call_result_answer(real_flow):
    client = api(real_flow[1])
    first = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=user(QUESTION), tools=[WEATHER],
                                           tool_choice="required", parallel_tool_calls=False, temperature=0,
                                           max_tokens=60).choices[0].message
    assert len(first.tool_calls) == 1
    call = first.tool_calls[0]
    conversation = user(QUESTION) + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature_c": 18, "sky": "cloudy"})}]
    final = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=conversation, tools=[WEATHER], temperature=0,
                                           max_tokens=60).choices[0]
    assert final.finish_reason in ("stop", "length") and final.message.content


def test_langchain_bind_tools_and_function_calling(real_flow):
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        return "sunny"
    llm = ChatOpenAI(base_url=f"http://127.0.0.1:{real_flow[1]}/v1", api_key="unused", model="SmolLM2-135M-Instruct", temperature=0,
                     max_tokens=60, max_retries=0)
    for choice in ("get_weather", "required"):
        message = llm.bind_tools([get_weather], tool_choice=choice).invoke(QUESTION)
        assert message.tool_calls and message.tool_calls[0]["name"] == "get_weather"
        assert isinstance(message.tool_calls[0]["args"]["city"], str) and not message.invalid_tool_calls
    person = llm.with_structured_output(Person, method="function_calling").invoke(
        "Invent a person with a name and an age.")
    assert isinstance(person, Person)


def test_pydantic_ai_output_type(real_flow):
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider
    model = OpenAIChatModel("SmolLM2-135M-Instruct", provider=OpenAIProvider(base_url=f"http://127.0.0.1:{real_flow[1]}/v1",
                                                         api_key="unused"))
    agent = Agent(model, output_type=Person, model_settings={"temperature": 0, "max_tokens": 80})
    assert isinstance(agent.run_sync("Invent a person with a name and an age.").output, Person)


def test_instructor_tools_mode(real_flow):
    python = os.environ.get("LLM_CLIENTS_PYTHON") or str(ROOT / ".venv-clients" / "bin" / "python")
    if not os.path.exists(python):
        pytest.skip("instructor's venv is absent: `make test` builds .venv-clients")
    run = subprocess.run([python, str(ROOT / "tests" / "clients" / "instructor_tools.py"),
                          f"http://127.0.0.1:{real_flow[1]}/v1"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert Person.model_validate_json(run.stdout.strip().splitlines()[-1])


async def test_the_websocket_chat_passes_tools(real_flow):
    import websockets
    async with websockets.connect(f"ws://127.0.0.1:{real_flow[1]}/chat") as ws:
        await ws.send(json.dumps({"prompt": QUESTION, "tools": json.dumps([WEATHER]), "tool_choice": "required",
                                  "parallel_tool_calls": False, "max_tokens": 60}))
        parts = []
        while (event := json.loads(await ws.recv()))["type"] == "token":
            parts += event.get("tool_calls", [])
    assert event["finish_reason"] == "tool_calls", event
    (call,) = event["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert "".join(p["function"]["arguments"] for p in parts) == call["function"]["arguments"]
    jsonschema.validate(json.loads(call["function"]["arguments"]), WEATHER["function"]["parameters"])
