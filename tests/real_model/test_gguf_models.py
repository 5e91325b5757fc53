"""GGUF files served from their own blocks (engine/model/gguf_native.py), with no fp32 copy:

- the default model's Q4_1 GGUF gives the logits of the folder `make model` exports, bit for bit;
- Gemma 3 270M's Q4_K_M (Q4_K, Q5_0, Q6_K and Q8_0 tensors, sliding-window layers, a 262k
  vocabulary) answers as the golden file holds, each prompt batched with the others as it does
  alone, and greedily as its fp32 run (transformers' own dequantization,
  fp32 weights and KV cache) does;
- Gemma, a base model with no chat template, answers chat on every chat route and stops at the
  plain format's next turn (engine/frontend/chat.py) rather than writing the conversation on.
"""
import asyncio
import dataclasses
import json

import pytest
import requests
import torch
import websockets

from contract import EngineConfig, SamplingParams
from engine.core.core import kv_pool_for
from engine.model.loader import load_model
from testing import golden
from testing.native_reference import as_the_engine_computes

GEMMA = "gemma-3-270m-q4_k_m"
FP32 = f"{GEMMA} fp32"
PROMPTS = ["The capital of France is", "The largest planet in the solar system is", "Water boils at",
           "Romeo and Juliet was written by"]


def test_the_default_models_gguf_gives_its_exported_folders_bits(real_model, default_gguf):
    logits = []
    for source in (real_model, default_gguf):
        loaded = load_model(EngineConfig(model=source))
        assert loaded.info.dtype == "int4"
        ids = loaded.tokenizer("The capital of France is", return_tensors="pt").input_ids
        with torch.no_grad():
            logits.append(loaded.model(ids).logits)
    assert torch.equal(*logits)


# the plain C path is left to tests/unit/test_gguf_types.py, which runs each quant type's kernel on
# every path bit for bit (here it would take half a minute of the suite)
@pytest.mark.parametrize("path", [p for p in golden.kernel_paths() if p != "portable"])
async def test_gemma_answers_as_the_golden_file_on_every_path(path, kernel_libraries, gguf_model, make_engine):
    await golden.check_path(path, kernel_libraries, make_engine, gguf_model, GEMMA, PROMPTS, chat=False,
                            alone_too=True)


async def test_gemma_greedy_is_its_fp32_runs(gguf_model, make_engine):
    """The fp32 run's answers are the golden file's FP32 section, written with LLM_WRITE_GOLDEN=1
    (loading fp32 takes some 90 s here); the README's example is the first."""
    if golden.WRITE:
        engine = make_engine(gguf_model, device="cpu", dtype="fp32")
        assert engine.info.dtype == "float32"
        answers = [await engine.complete(p, SamplingParams(max_tokens=golden.MAX_TOKENS)) for p in PROMPTS]
        golden.check(FP32, [{"prompt": p, "text": "".join(o.text for o in outs)}
                            for p, outs in zip(PROMPTS, answers, strict=True)], "native")
    fp32 = {a["prompt"]: a["text"] for a in golden.expected(FP32)}
    blocks = {a["prompt"]: a["text"] for a in golden.expected(GEMMA)}
    assert blocks == fp32  # every prompt, all MAX_TOKENS tokens


async def test_gemmas_local_layers_keep_only_their_window(gguf_model, make_engine):
    """docs/operations.md's figures: Gemma 3's 15 local layers (a window of 512) keep their keys in
    a window pool sized for max_running rows, so the KV cache takes 96 + 264 MB where every layer
    in the main pool would take 576 MB, and 648 MB where it would take 2,304 MB at
    max_batch_tokens 131072."""
    engine = make_engine(gguf_model, device="cpu")
    pool = engine.core.kv.pool
    shape = pool.shape
    assert len(shape.window_layers) == 15 and len(shape.main_layers) == 3 and shape.window == 512
    assert (_mb(pool.keys, pool.values), _mb(pool.group_keys[1], pool.group_values[1])) == (96, 264)
    assert (pool.blocks - 1) * shape.block_size * shape.bytes_per_token / 2**20 == 576
    long = kv_pool_for(engine.core.loaded, dataclasses.replace(engine.core.config, max_batch_tokens=131072))
    assert _mb(*long.group_keys, *long.group_values) == 648
    assert 131072 * shape.bytes_per_token / 2**20 == 2304


def _mb(*tensors: torch.Tensor) -> int:
    """Their bytes, in whole MiB (rounded)."""
    return round(sum(t.numel() * t.element_size() for t in tensors) / 2**20)


async def test_gemma_past_its_window_gives_its_own_forwards_numbers(gguf_model, make_engine):
    """A prompt longer than Gemma 3's window (512), prefilled in two chunks: its local layers read
    the window pool, the blocks the window has passed given back. The answer's log probabilities
    are the loaded model's own forward over the whole sequence (its local layers masked by
    transformers' sliding-window mask, in PyTorch's SDPA) within float rounding: 3e-5 at most
    here, where the window pool giving back two blocks too early moves them by 1e-2."""
    engine = make_engine(gguf_model, device="cpu")
    prompt = " ".join(f"Item {i} is on shelf {i % 7}." for i in range(80))
    tokens = engine.tokenizer(prompt)["input_ids"]
    assert 600 < len(tokens) < 1024
    outs = await engine.complete(prompt, SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, logprobs=True))
    ids, logprobs = [t for o in outs for t in o.token_ids], [lp for o in outs for lp in o.logprobs]
    kv = engine.core.kv
    assert len(kv.groups) == 2 and not kv.groups[1].readers
    loaded = engine.core.loaded
    model = as_the_engine_computes(loaded.model, loaded.plan is not None and loaded.plan.stack is not None)
    with torch.inference_mode():
        logits = model(torch.tensor([tokens + ids])).logits[0, len(tokens) - 1:-1]
    reference = torch.log_softmax(logits.double(), dim=-1)
    assert ids == reference.argmax(dim=-1).tolist()
    assert (reference[torch.arange(16), ids] - torch.tensor(logprobs, dtype=torch.float64)).abs().max() < 1e-3


@pytest.fixture(scope="module")
def gemma_flow(gguf_model, tmp_path_factory):
    """A Flow serving Gemma from its GGUF file: its HTTP address."""
    from testing.flows import start_flow
    server, _, http_port = start_flow(gguf_model, tmp_path_factory.mktemp("gemma_flow"))
    yield f"127.0.0.1:{http_port}"
    server.stop()


def test_gemma_chat_stops_at_the_next_turn_on_every_chat_route(gemma_flow):
    """Without its turn markers as stops, Gemma answers "The capital of France is Paris." and then
    writes "User: ... Assistant: ..." turns up to max_tokens."""
    question, url = "What is the capital of France?", f"http://{gemma_flow}"
    messages = [{"role": "user", "content": question}]

    def post(path: str, body: dict) -> dict:
        response = requests.post(url + path, json=body, timeout=300)
        assert response.status_code == 200, response.text
        return response.json()
    model = requests.get(url + "/v1/models", timeout=60).json()["data"][0]["id"]
    openai = post("/v1/chat/completions", {"messages": messages, "max_tokens": 64, "temperature": 0})
    choice = openai["choices"][0]
    answer = choice["message"]["content"]
    assert choice["finish_reason"] == "stop" and "Paris" in answer and "User:" not in answer, answer
    assert openai["usage"]["completion_tokens"] < 64 and not answer.endswith("\n")
    anthropic = post("/v1/messages", {"messages": messages, "max_tokens": 64, "temperature": 0})
    assert (anthropic["content"][0]["text"], anthropic["stop_reason"], anthropic["stop_sequence"]) == \
        (answer, "end_turn", None)
    ollama = post("/api/chat", {"model": model, "messages": messages, "stream": False,
                                "options": {"temperature": 0, "num_predict": 64}})
    assert (ollama["message"]["content"], ollama["done_reason"]) == (answer, "stop")
    responses = post("/v1/responses", {"input": question, "max_output_tokens": 64, "temperature": 0})
    assert (responses["output"][-1]["content"][0]["text"], responses["status"]) == (answer, "completed")

    async def over_websocket() -> tuple[str, str]:
        text = ""
        async with websockets.connect(f"ws://{gemma_flow}/chat") as ws:
            await ws.send(json.dumps({"prompt": question, "max_tokens": 64}))
            while (event := json.loads(await ws.recv()))["type"] == "token":
                text += event["text"]
        return text, event["finish_reason"]
    assert asyncio.run(over_websocket()) == (answer, "eos_token")
