"""Two models in one Flow, as `LLM_MODELS=a,b make serve` runs them (deploy/flow_models.py): each
answers under its own name on every protocol, a request that names none gets the first, and a name
that neither has is refused with 404 (NOT_FOUND on gRPC) naming both. The second is a reasoning
model's shape: its thoughts come apart on every protocol."""
import asyncio
import json
import subprocess
import sys
import time
from typing import Optional

import psutil
import pytest
import requests
import websockets

from client import StreamError, generate
from testing.procs import ROOT
from tests.gateway_helpers import chat_page, needs_chromium, set_fields

GREEDY = {"max_tokens": 6, "temperature": 0}


@pytest.fixture(scope="module")
def two_models(gpt2_model, thinking_model, tmp_path_factory):
    """(grpc_port, http_port, the Flow's pid) of a Flow serving the tiny gpt2 first, then a tiny
    reasoning model (its chat template opens a think block)."""
    from testing.flows import start_flow
    server, grpc_port, http_port = start_flow("", tmp_path_factory.mktemp("models"), models=[gpt2_model, thinking_model])
    yield grpc_port, http_port, server.proc.pid
    server.stop()


def _openai(http_port: int, **body) -> requests.Response:
    return requests.post(f"http://127.0.0.1:{http_port}/v1/completions", json={"prompt": "hello", **GREEDY, **body},
                         timeout=120)


def test_the_models_are_listed_in_order(two_models):
    cards = requests.get(f"http://127.0.0.1:{two_models[1]}/v1/models", timeout=30).json()["data"]
    assert [c["id"] for c in cards] == ["gpt2", "thinking"]
    tags = requests.get(f"http://127.0.0.1:{two_models[1]}/api/tags", timeout=30).json()["models"]
    assert [m["name"] for m in tags] == ["gpt2:latest", "thinking:latest"]


def test_each_model_answers_under_its_own_name_on_every_protocol(two_models):
    grpc_port, http_port, _ = two_models
    answers = {}
    for name in ("gpt2", "thinking"):
        r = _openai(http_port, model=name)
        assert r.status_code == 200 and r.json()["model"] == name, r.text
        answers[name] = r.json()["choices"][0]["text"]
        tgi = requests.post(f"http://127.0.0.1:{http_port}/generate", timeout=120, json={
            "inputs": "hello", "parameters": {"model": name, "max_new_tokens": 6}}).json()
        ollama = requests.post(f"http://127.0.0.1:{http_port}/api/generate", timeout=120, json={
            "model": name, "prompt": "hello", "raw": True, "stream": False,
            "options": {"temperature": 0, "num_predict": 6}}).json()
        grpc = asyncio.run(generate("hello", port=grpc_port, model=name, max_tokens=6))
        sse = asyncio.run(generate("hello", port=http_port, protocol="http", model=name, max_tokens=6))
        assert tgi["generated_text"] == ollama["response"] == grpc.text == sse.text == answers[name], name
    assert answers["gpt2"] != answers["thinking"]  # two models, two answers
    assert _openai(http_port).json()["choices"][0]["text"] == answers["gpt2"]  # none named: the first
    cli = subprocess.run([sys.executable, "-m", "client", "hello", "--model", "thinking", "--max-tokens", "6",
                          "--port", str(grpc_port)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert cli.returncode == 0 and cli.stdout.strip() == answers["thinking"].strip(), cli.stderr


async def _ws_answer(http_port: int, model: str) -> dict:
    async with websockets.connect(f"ws://127.0.0.1:{http_port}/chat") as ws:
        await ws.send(json.dumps({"prompt": "hello", "model": model, "max_tokens": 6}))
        while (event := json.loads(await ws.recv()))["type"] == "token":
            pass
        return event


def test_an_unknown_model_is_refused_on_every_protocol(two_models):
    grpc_port, http_port, _ = two_models
    r = _openai(http_port, model="gpt-4o")
    assert r.status_code == 404 and "gpt-4o" in r.text and "'gpt2', 'thinking'" in r.text, r.text
    r = requests.post(f"http://127.0.0.1:{http_port}/v1/messages", timeout=60, json={
        "model": "gpt-4o", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error", r.text
    for protocol, port in (("grpc", grpc_port), ("http", http_port)):
        with pytest.raises(StreamError) as refused:
            asyncio.run(generate("hello", port=port, protocol=protocol, model="gpt-4o", max_tokens=4))
        assert "gpt-4o" in str(refused.value) and refused.value.error_type in ("not_found", "validation"), protocol
    event = asyncio.run(_ws_answer(http_port, "gpt-4o"))
    assert event["type"] == "error" and "gpt-4o" in event["error"] and event["error_type"] == "not_found", event


def _states(http_port: int) -> dict[str, str]:
    cards = requests.get(f"http://127.0.0.1:{http_port}/v1/models", timeout=30).json()["data"]
    return {c["id"]: c["state"] for c in cards}


def _tree_rss(pid: int, without: Optional[int] = None) -> int:
    """The Flow's resident memory: its processes and all of theirs (but `without`), in bytes."""
    root = psutil.Process(pid)
    return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)] if p.is_running() and p.pid != without)


def test_a_model_unloads_freeing_its_memory_and_the_next_request_loads_it_again(two_models):
    """A request's keep_alive 0 unloads its model once it ends: its engine process exits (the
    Flow's memory, but the spare engine process the unload starts, falls by about its size) while
    the other model serves on; the next request for it waits for the load and gets the same tokens."""
    _, http_port, pid = two_models
    first = _openai(http_port, model="thinking", keep_alive=0)
    assert first.status_code == 200, first.text
    loaded_rss = _tree_rss(pid)
    for _ in range(300):
        if _states(http_port)["thinking"] == "unloaded":
            break
        time.sleep(0.1)
    assert _states(http_port) == {"gpt2": "loaded", "thinking": "unloaded"}
    stats = requests.get(f"http://127.0.0.1:{http_port}/stats", timeout=30).json()
    unloaded_rss = _tree_rss(pid, without=stats["models"]["thinking"]["replicas"][0]["spare"]["pid"])
    assert unloaded_rss < loaded_rss - 100 * 2**20, (loaded_rss, unloaded_rss)  # an engine process is gone
    assert _openai(http_port, model="gpt2").status_code == 200  # the other serves on
    again = _openai(http_port, model="thinking")
    assert again.json()["choices"][0]["text"] == first.json()["choices"][0]["text"]
    assert _states(http_port)["thinking"] == "loaded" and _tree_rss(pid) > unloaded_rss + 100 * 2**20
    print(f"the Flow's RSS: {loaded_rss / 2**20:.0f} MiB with both loaded, {unloaded_rss / 2**20:.0f} MiB "
          f"with one unloaded")


def test_stats_and_metrics_speak_for_every_model(two_models):
    _, http_port, _ = two_models
    stats = requests.get(f"http://127.0.0.1:{http_port}/stats", timeout=30).json()
    assert set(stats["models"]) == {"gpt2", "thinking"} and stats["healthy"]
    assert all(s["replicas"][0]["model_state"] in ("loaded", "unloaded") for s in stats["models"].values())
    metrics = requests.get(f"http://127.0.0.1:{http_port}/metrics", timeout=30).text
    running = [line for line in metrics.splitlines() if line.startswith("vllm:num_requests_running{")]
    assert {name for name in ("gpt2", "thinking") if any(f'model_name="{name}"' in line for line in running)} \
        == {"gpt2", "thinking"}, running
    assert metrics.count("# TYPE vllm:num_requests_running ") == 1


def test_a_reasoning_models_thoughts_come_apart_on_every_protocol(two_models):
    """The real engine through the Flow: OpenAI chat whole and streamed, Anthropic, Responses,
    Ollama and Jina's gRPC give the same thoughts and the same answer; the budget ends them."""
    grpc_port, http_port, _ = two_models
    url = f"http://127.0.0.1:{http_port}"
    ask = {"model": "thinking", "messages": [{"role": "user", "content": "hello"}], "temperature": 0}
    whole = requests.post(f"{url}/v1/chat/completions", json={**ask, "max_tokens": 12, "reasoning_budget": 4},
                          timeout=120).json()
    assert whole["usage"]["completion_tokens_details"] == {"reasoning_tokens": 5}  # four thoughts, the close marker
    chat = whole["choices"][0]["message"]
    assert chat["reasoning"] and chat["content"] and chat["reasoning"] == chat["reasoning_content"]
    with requests.post(f"{url}/v1/chat/completions", json={**ask, "max_tokens": 12, "reasoning_budget": 4,
                                                            "stream": True}, stream=True, timeout=120) as r:
        deltas = [json.loads(line[6:])["choices"][0]["delta"] for line in r.iter_lines(decode_unicode=True)
                  if line.startswith("data: {") and json.loads(line[6:])["choices"]]
    assert "".join(d.get("reasoning", "") for d in deltas) == chat["reasoning"]
    assert "".join(d.get("content") or "" for d in deltas) == chat["content"]
    anthropic = requests.post(f"{url}/v1/messages", timeout=120, json={
        **ask, "max_tokens": 12, "thinking": {"type": "enabled", "budget_tokens": 4}}).json()["content"]
    assert [b.get("thinking", b.get("text")) for b in anthropic] == [chat["reasoning"], chat["content"]]
    grpc = asyncio.run(generate("", port=grpc_port, model="thinking", messages=ask["messages"], max_tokens=12,
                                reasoning_budget=4))
    assert (grpc.reasoning, grpc.text) == (chat["reasoning"], chat["content"])
    unbounded = requests.post(f"{url}/v1/chat/completions", json={**ask, "max_tokens": 8}, timeout=120).json()
    thoughts = unbounded["choices"][0]["message"]["reasoning"]  # it never closes within 8 tokens
    ollama = requests.post(f"{url}/api/chat", timeout=120, json={
        "model": "thinking", "messages": ask["messages"], "stream": False, "think": True,
        "options": {"temperature": 0, "num_predict": 8}}).json()
    responses = requests.post(f"{url}/v1/responses", timeout=120, json={
        "model": "thinking", "input": "hello", "temperature": 0, "max_output_tokens": 8}).json()["output"]
    assert ollama["message"]["thinking"] == responses[0]["content"][0]["text"] == thoughts


@needs_chromium
def test_the_chat_page_folds_the_thoughts_apart(two_models):
    """/chat-ui?model=thinking: the thoughts of the streamed answer are shown apart (textContent),
    equal to what OpenAI chat returns for the same greedy request."""
    from playwright.sync_api import expect
    _, http_port, _ = two_models
    ref = requests.post(f"http://127.0.0.1:{http_port}/v1/chat/completions", timeout=120, json={
        "model": "thinking", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8,
        "temperature": 0}).json()["choices"][0]["message"]
    with chat_page(f"http://127.0.0.1:{http_port}/chat-ui?model=thinking") as page:
        set_fields(page, temperature=0, max_tokens=8)
        page.fill("#prompt", "hello")
        page.click("#send")
        expect(page.locator("body")).to_have_attribute("data-state", "idle", timeout=60000)
        thinking = page.locator(".message.assistant .thinking div").last
        assert thinking.text_content() == ref["reasoning"] and ref["reasoning"]
        assert page.locator(".message.assistant").last.get_attribute("data-text") == ref["content"]
