"""The clients that agents are built on, against the real model: Anthropic's Messages API (the
anthropic SDK, langchain-anthropic, pydantic-ai, LiteLLM) and OpenAI's Responses API (the openai
SDK, the openai-agents SDK), run in their own venv (tests/clients/agent_clients.py). Streamed
equals not streamed, for text and for tool arguments, on both routes."""
import json
import os
import subprocess
from pathlib import Path

import jsonschema
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "clients" / "agent_clients.py"
PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}


def check(name: str, http_port: int) -> dict:
    python = os.environ.get("LLM_CLIENTS_PYTHON") or str(ROOT / ".venv-clients" / "bin" / "python")
    if not os.path.exists(python):
        pytest.skip("the clients' venv is absent: `make test` builds .venv-clients")
    run = subprocess.run([python, str(SCRIPT), name, f"http://127.0.0.1:{http_port}"], capture_output=True, text=True,
                         timeout=180)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_the_anthropic_sdk(real_flow):
    got = check("anthropic_sdk", real_flow[1])
    assert got["text"] == got["streamed"] == "The capital of France is Paris." and got["stop_reason"] == "end_turn"
    usage = got["usage"]
    assert usage["input_tokens"] + usage["cache_read_input_tokens"] == got["count"] and usage["output_tokens"] > 0
    assert got["call_stop"] == "tool_use" and got["calls"] and all(c["type"] == "tool_use" for c in got["calls"])
    assert [(c["name"], c["input"]) for c in got["calls"]] == [(c["name"], c["input"]) for c in got["streamed_calls"]]
    assert all(isinstance(c["input"]["city"], str) for c in got["calls"])


def test_langchain_anthropic_binds_tools(real_flow):
    got = check("langchain_anthropic", real_flow[1])
    assert got["tool_calls"] and not got["invalid"]
    assert all(c["name"] == "get_weather" and isinstance(c["args"]["city"], str) for c in got["tool_calls"])


def test_pydantic_ai_on_the_anthropic_model(real_flow):
    jsonschema.validate(check("pydantic_ai_anthropic", real_flow[1])["person"], PERSON)


def test_litellms_anthropic_provider(real_flow):
    got = check("litellm_anthropic", real_flow[1])
    assert got["text"] == got["streamed"] == "The capital of France is Paris."


def test_the_openai_sdks_responses(real_flow):
    got = check("openai_responses", real_flow[1])
    assert got["text"] == got["streamed"] == "The capital of France is Paris." and got["status"] == "completed"
    assert got["usage"]["total_tokens"] == got["usage"]["input_tokens"] + got["usage"]["output_tokens"]
    assert got["calls"] and got["calls"] == got["streamed_calls"]
    assert all(name == "get_weather" and isinstance(json.loads(args)["city"], str) for name, args in got["calls"])
    jsonschema.validate(json.loads(got["formatted"]), PERSON)


def test_an_openai_agent_runs_its_tool_to_a_final_answer(real_flow):
    got = check("openai_agents", real_flow[1])
    assert got["asked"] and all(isinstance(city, str) and city for city in got["asked"])
    assert isinstance(got["final"], str) and got["final"]
