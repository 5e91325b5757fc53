"""min_p and OpenAI's presence/frequency penalties: right in the engine (against a reference
computed here), and the same on every protocol, which take them from SamplingParams alone."""
import json
import subprocess
import sys
from collections import Counter

import pytest
import requests
import torch
import websockets
from transformers import AutoModelForCausalLM, AutoTokenizer

from client import generate
from contract import EngineConfig, SamplingParams
from engine import AsyncEngine
from engine.model.loader import pick_device
from tests.conftest import ROOT
from tests.gateway_helpers import sse_data

PROMPT = "the quick brown fox"


async def engine_text(engine: AsyncEngine, **params) -> str:
    text = ""
    async for chunk in engine.generate(PROMPT, SamplingParams(**params)):
        text += chunk.text
    return text


@pytest.fixture(scope="module")
async def engine(gpt2_model):
    """fp32 on every device, as the reference below computes: in bf16 (CUDA's default) a full
    forward and a KV-cached step round differently, and a random model's close logits flip."""
    engine = AsyncEngine(EngineConfig(model=gpt2_model, dtype="fp32"))
    yield engine
    engine.shutdown()


async def test_penalties_match_openais_definition(engine, gpt2_model):
    """Greedy with the penalties equals a loop that applies OpenAI's formula by hand:
    score -= frequency * count + presence * (count > 0), over the generated tokens."""
    tok = AutoTokenizer.from_pretrained(gpt2_model)
    model = AutoModelForCausalLM.from_pretrained(gpt2_model).to(pick_device(None)).eval()
    prompt_ids = tok(PROMPT)["input_ids"]
    for presence, frequency in ((0.0, 1.5), (1.2, 0.0), (0.7, 0.9), (-0.5, -0.5)):
        generated: list[int] = []
        for _ in range(24):
            with torch.no_grad():
                logits = model(torch.tensor([prompt_ids + generated], device=model.device)).logits[0, -1].float()
            for token, count in Counter(generated).items():
                logits[token] -= frequency * count + presence
            generated.append(int(torch.argmax(logits)))
        got = await engine_text(engine, max_tokens=24, presence_penalty=presence, frequency_penalty=frequency,
                                ignore_eos=True)
        assert got == tok.decode(generated, skip_special_tokens=True), (presence, frequency)
    assert await engine_text(engine, max_tokens=24, frequency_penalty=1.5) != \
        await engine_text(engine, max_tokens=24)  # they do change the answer


async def test_min_p_one_keeps_only_the_likeliest_token(engine):
    greedy = await engine_text(engine, max_tokens=24)
    for seed in (1, 2, 3):
        assert await engine_text(engine, max_tokens=24, do_sample=True, seed=seed, min_p=1.0) == greedy
    assert await engine_text(engine, max_tokens=24, do_sample=True, seed=1, min_p=0.0) != greedy


async def test_every_protocol_honours_min_p_and_the_penalties(flow):
    grpc_port, http_port = flow
    base = f"http://127.0.0.1:{http_port}"
    greedy = (await generate(PROMPT, port=grpc_port, max_tokens=16)).generated_text
    penalized = (await generate(PROMPT, port=grpc_port, max_tokens=16, presence_penalty=0.5,
                                frequency_penalty=1.5)).generated_text
    assert penalized != greedy
    min_p = {"do_sample": True, "seed": 5, "min_p": 1.0}
    assert (await generate(PROMPT, port=grpc_port, max_tokens=16, **min_p)).generated_text == greedy
    # OpenAI: min_p as an extension; its own presence/frequency penalties
    oai = {"prompt": PROMPT, "max_tokens": 16}
    assert requests.post(f"{base}/v1/completions", json={**oai, "min_p": 1.0}).json()["choices"][0]["text"] == greedy
    r = requests.post(f"{base}/v1/completions", json={**oai, "temperature": 0, "presence_penalty": 0.5,
                                                        "frequency_penalty": 1.5})
    assert r.json()["choices"][0]["text"] == penalized
    # TGI: extensions in `parameters`
    tgi = {"inputs": PROMPT, "parameters": {"max_new_tokens": 16, **min_p}}
    assert requests.post(f"{base}/generate", json=tgi).json()["generated_text"] == greedy
    tgi = {"inputs": PROMPT, "parameters": {"max_new_tokens": 16, "presence_penalty": 0.5, "frequency_penalty": 1.5}}
    assert requests.post(f"{base}/generate", json=tgi).json()["generated_text"] == penalized
    # Jina SSE
    with requests.get(f"{base}/stream", json={"prompt": PROMPT, "max_tokens": 16, **min_p}, stream=True) as r:
        assert list(sse_data(r.iter_lines(decode_unicode=True)))[-1]["generated_text"] == greedy
    # WebSocket: a chat turn, the same as gRPC with that message
    chat_greedy = (await generate("", port=grpc_port, max_tokens=8,
                                  messages=[{"role": "user", "content": PROMPT}])).generated_text
    async with websockets.connect(f"ws://127.0.0.1:{http_port}/chat") as ws:
        await ws.send(json.dumps({"prompt": PROMPT, "max_tokens": 8, **min_p}))
        text = ""
        while (event := json.loads(await ws.recv()))["type"] == "token":
            text += event["text"]
    assert text == chat_greedy
    # the CLI
    run = subprocess.run([sys.executable, "-m", "client", PROMPT, "--port", str(grpc_port), "--max-tokens", "16",
                          "--do-sample", "--seed", "5", "--min-p", "1", "--presence-penalty", "0"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.rstrip("\n") == greedy, run.stderr


@pytest.mark.parametrize("name,value", [("min_p", 1.5), ("presence_penalty", 2.5), ("frequency_penalty", -3)])
def test_out_of_range_options_are_refused_naming_them(flow, name, value):
    _, http_port = flow
    base = f"http://127.0.0.1:{http_port}"
    r = requests.post(f"{base}/v1/completions", json={"prompt": "x", name: value})
    assert r.status_code == 400 and r.json()["error"]["param"] == name, r.text
    r = requests.post(f"{base}/generate", json={"inputs": "x", "parameters": {name: value}})
    assert r.status_code == 422 and r.json()["error"].startswith(name), r.text
