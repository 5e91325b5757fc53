"""The agent-era clients against the service, in their own venv (.venv-clients: their pins clash with
Jina's): `python agent_clients.py CHECK BASE_URL` runs one check and prints its findings as one line
of JSON, which tests/real_model/test_agent_clients.py asserts on.

The anthropic SDK no longer takes `temperature` as an argument: greedy answers ask for it in the
body (`extra_body`), as any field the SDK does not know travels."""
import asyncio
import json
import os
import sys
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # LiteLLM fetches a price list otherwise
GREEDY = {"temperature": 0}
QUESTION = "What is the capital of France?"
WEATHER = {"name": "get_weather", "description": "The current weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


def anthropic_sdk(base: str) -> dict[str, Any]:
    import anthropic
    client = anthropic.Anthropic(base_url=base, api_key="unused")
    ask = {"model": "SmolLM2-135M-Instruct", "max_tokens": 40, "messages": [{"role": "user", "content": QUESTION}], "extra_body": GREEDY}
    created = client.messages.create(**ask)
    with client.messages.stream(**ask) as stream:
        streamed = "".join(stream.text_stream)
    tooled = {**ask, "max_tokens": 60, "tools": [WEATHER], "tool_choice": {"type": "tool", "name": "get_weather"},
              "messages": [{"role": "user", "content": "What's the weather in Paris?"}]}
    call = client.messages.create(**tooled)
    with client.messages.stream(**tooled) as stream:
        streamed_call = stream.get_final_message()
    count = client.messages.count_tokens(model="SmolLM2-135M-Instruct", messages=ask["messages"])
    return {"text": created.content[0].text, "streamed": streamed, "stop_reason": created.stop_reason,
            "usage": created.usage.model_dump(), "calls": [b.model_dump() for b in call.content],
            "streamed_calls": [b.model_dump() for b in streamed_call.content], "call_stop": call.stop_reason,
            "count": count.input_tokens}


def langchain_anthropic(base: str) -> dict[str, Any]:
    from langchain_anthropic import ChatAnthropic
    llm = ChatAnthropic(model="SmolLM2-135M-Instruct", base_url=base, api_key="unused", max_tokens=60, model_kwargs={})

    def get_weather(city: str) -> str:
        """The current weather in a city."""
        return "sunny"
    message = llm.bind_tools([get_weather], tool_choice="get_weather").invoke("What's the weather in Paris?")
    return {"tool_calls": message.tool_calls, "invalid": message.invalid_tool_calls}


def pydantic_ai_anthropic(base: str) -> dict[str, Any]:
    from pydantic import BaseModel
    from pydantic_ai import Agent
    from pydantic_ai.models.anthropic import AnthropicModel
    from pydantic_ai.providers.anthropic import AnthropicProvider

    class Person(BaseModel):
        name: str
        age: int
    model = AnthropicModel("SmolLM2-135M-Instruct", provider=AnthropicProvider(base_url=base, api_key="unused"))
    agent = Agent(model, output_type=Person, model_settings={"max_tokens": 80})
    return {"person": agent.run_sync("Invent a person with a name and an age.").output.model_dump()}


def litellm_anthropic(base: str) -> dict[str, Any]:
    import litellm
    ask = {"model": "anthropic/SmolLM2-135M-Instruct", "api_base": base, "api_key": "unused", "max_tokens": 40, "temperature": 0,
           "messages": [{"role": "user", "content": QUESTION}]}
    whole = litellm.completion(**ask)
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in litellm.completion(**ask, stream=True))
    return {"text": whole.choices[0].message.content, "streamed": streamed}


def openai_responses(base: str) -> dict[str, Any]:
    from openai import OpenAI
    client = OpenAI(base_url=base + "/v1", api_key="unused")
    ask = {"model": "SmolLM2-135M-Instruct", "input": QUESTION, "max_output_tokens": 40, **GREEDY}
    created = client.responses.create(**ask)
    with client.responses.stream(**ask) as stream:
        deltas = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
    tools = [{"type": "function", "name": "get_weather", "description": WEATHER["description"],
              "parameters": WEATHER["input_schema"]}]
    tooled = {**ask, "input": "What's the weather in Paris?", "tools": tools, "tool_choice": "required",
              "max_output_tokens": 60}
    called = client.responses.create(**tooled)
    with client.responses.stream(**tooled) as stream:
        streamed_call = stream.get_final_response()
    formatted = client.responses.create(**{**ask, "input": "Invent a person.", "max_output_tokens": 60}, text={
        "format": {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}})
    return {"text": created.output_text, "streamed": deltas, "status": created.status,
            "usage": created.usage.model_dump(), "formatted": formatted.output_text,
            "calls": [(o.name, o.arguments) for o in called.output if o.type == "function_call"],
            "streamed_calls": [(o.name, o.arguments) for o in streamed_call.output if o.type == "function_call"]}


def openai_agents(base: str) -> dict[str, Any]:
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI
    set_tracing_disabled(True)
    asked: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        asked.append(city)
        return f"It is sunny and 22 C in {city}."
    model = OpenAIResponsesModel(model="SmolLM2-135M-Instruct", openai_client=AsyncOpenAI(base_url=base + "/v1", api_key="unused"))
    agent = Agent(name="weather", instructions="Answer with the weather, from the tool.", tools=[get_weather],
                  model=model, model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=80))
    result = asyncio.run(Runner.run(agent, "What's the weather in Paris?", max_turns=4))
    return {"asked": asked, "final": result.final_output}


CHECKS = {f.__name__: f for f in (anthropic_sdk, langchain_anthropic, pydantic_ai_anthropic, litellm_anthropic,
                                  openai_responses, openai_agents)}

if __name__ == "__main__":
    print(json.dumps(CHECKS[sys.argv[1]](sys.argv[2]), default=str))
