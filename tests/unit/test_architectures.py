"""Today's small architectures (testing/toy_models.ARCHITECTURES: Qwen2, Qwen3, Mistral, Phi-3,
Gemma 3, Gemma 2), tiny and random, built from their transformers configs with no download, served
with int4 weights and the fp16 KV cache, every one in whole C layers (llama_layer.c). Each
gives transformers' own log probabilities (its eager forward, fp32) within a stated tolerance, and
keeps the engine's promises: a request batched with others answers as it does alone, and a prompt
served from the prefix cache answers as it did uncached."""
import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from contract import SamplingParams
from engine.model.int4 import q8_0
from executors.convert import server_info
from testing.toy_models import ARCHITECTURES

from ..conftest import shared_build

# long enough to fill cache blocks of their own
PROMPTS = [" ".join([words] * 6) for words in ("the quick brown fox", "a lazy dog sleeps over the hill and far away",
                                                "streams of tokens flow")]


@pytest.fixture(scope="module", params=sorted(ARCHITECTURES))
def architecture_model(request, models_dir) -> str:
    return shared_build(models_dir / f"arch-{request.param}", request.param, four_bit=True)


async def test_batched_equals_alone_and_cached_equals_uncached(architecture_model, make_engine):
    engine = make_engine(architecture_model, device="cpu")
    assert engine.info.dtype == "int4" and engine.info.kv_cache_dtype == "float16"
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, logprobs=True)

    async def answer(prompt: str) -> tuple[list[int], list[float], int]:
        outs = await engine.complete(prompt, params)
        return [t for o in outs for t in o.token_ids], [lp for o in outs for lp in o.logprobs], outs[-1].cached_tokens

    alone = [await answer(p) for p in PROMPTS]  # each alone, its prompt new to the cache
    together = await asyncio.gather(*(answer(p) for p in PROMPTS))  # batched, from the cache
    assert [a[:2] for a in together] == [a[:2] for a in alone]
    assert all(len(tokens) == 16 for tokens, _, _ in alone)
    assert all(cached == 0 for _, _, cached in alone) and all(cached > 0 for _, _, cached in together)


# The reference is transformers' forward of the same weights, the output layer's rounded to Q8_0 as
# the engine keeps it. The engine rounds each product's activations to int16 per block of 32 (a
# relative 2^-16 of the block's largest value) and sums in its own order, which moves a log
# probability by at most 5e-4 here (7e-5 to 5e-4 by architecture); 2e-3 leaves room for that and
# is far below what a wrong norm, bias, window or rotary base would do (tenths to whole units).
TOLERANCE = 2e-3


async def test_log_probabilities_are_transformers_own(architecture_model, make_engine):
    engine = make_engine(architecture_model, device="cpu", kv_cache_dtype="fp32")
    outs = await engine.complete(PROMPTS[1], SamplingParams(max_tokens=16, temperature=0, ignore_eos=True,
                                                            logprobs=True))
    tokens = [t for o in outs for t in o.token_ids]
    logprobs = torch.tensor([lp for o in outs for lp in o.logprobs], dtype=torch.float64)
    tokenizer = AutoTokenizer.from_pretrained(architecture_model)
    model = AutoModelForCausalLM.from_pretrained(architecture_model, dtype=torch.float32, attn_implementation="eager")
    head = model.get_output_embeddings()
    steps, scale = q8_0(head.weight.detach())  # the engine's output layer keeps int8 steps (Q8_0)
    head.weight = torch.nn.Parameter(steps.float() * scale.float().repeat_interleave(32, dim=1)[:, :steps.shape[1]])
    prompt = tokenizer(PROMPTS[1], return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(torch.cat([prompt, torch.tensor([tokens[:-1]])], dim=1)).logits[0, prompt.shape[1] - 1:]
    reference = torch.log_softmax(logits.double(), dim=-1)
    assert len(tokens) == 16
    differences = (reference[torch.arange(16), tokens] - logprobs).abs()
    assert differences.max() < TOLERANCE, differences
    # greedy: each token is transformers' best, or within the tolerance of it
    assert (reference.max(dim=-1).values - reference[torch.arange(16), tokens]).max() < TOLERANCE


KIN = ("mistral", "phi3", "qwen2", "qwen3")  # Llama's layer shape, with features llama_layer.c has too
GEMMA = ("gemma2", "gemma3_text")  # whole layers in C too, with Gemma's features


def _load_logging(path: str, caplog) -> tuple[Any, list[str]]:
    """(the loaded model, its load's "decoder layers:" log lines)."""
    from contract import EngineConfig
    from engine.model.loader import load_model
    with caplog.at_level("INFO", logger="engine.model.loader"):
        loaded = load_model(EngineConfig(model=path, device="cpu"))
    assert loaded.info.dtype == "int4"
    return loaded, [r.getMessage() for r in caplog.records if "decoder layers:" in r.getMessage()]


def test_the_load_says_why_layers_run_outside_the_c_layers(models_dir, tmp_path, caplog):
    """A partial rotary embedding (Phi-4-mini's) is not in llama_layer.c: the model serves through
    transformers' modules, and the load says why, once."""
    source = Path(shared_build(models_dir / "arch-phi3", "phi3", four_bit=True))
    shutil.copytree(source, tmp_path / "partial", dirs_exist_ok=True)
    config = json.loads((tmp_path / "partial" / "config.json").read_text())
    (tmp_path / "partial" / "config.json").write_text(json.dumps({**config, "partial_rotary_factor": 0.5}))
    loaded, lines = _load_logging(str(tmp_path / "partial"), caplog)
    assert len(lines) == 1 and "turns part of each head only" in lines[0], lines
    assert loaded.plan.stack is None and "transformers' modules" in lines[0]


def test_every_architecture_runs_its_whole_stack_in_c(architecture_model, caplog):
    loaded, lines = _load_logging(architecture_model, caplog)
    # every layer in llama_layer.c, the stack in one call, said once
    assert len(lines) == 1 and "in llama_layer.c, one call a step" in lines[0], lines
    assert loaded.plan.stack is not None and len(loaded.plan.stack.layers) == loaded.model.config.num_hidden_layers


@pytest.mark.parametrize("style", [*KIN, *GEMMA])
async def test_whole_layers_give_the_numbers_of_transformers_layers(models_dir, make_engine, monkeypatch, style):
    """Qwen2's biases, Qwen3's q and k norms, Mistral's window, Phi-3's fused projections, and
    Gemma's norms around each sublayer, (1 + w) norms, GeGLU, capped scores and local and global
    rotary tables, in llama_layer.c's whole layers: the same tokens and log probabilities as
    transformers' own layers (with the C norms and activations), bit for bit, greedy and seeded."""
    from tests.unit.test_int4 import _answers, _stack_and_reference
    kin_model = shared_build(models_dir / f"arch-{style}", style, four_bit=True)
    stack, reference, requests = _stack_and_reference(kin_model, make_engine, monkeypatch)
    answers = await _answers(stack, requests)
    assert answers == await _answers(reference, requests) and all(ids for ids, _ in answers)


def _mixed_kinds(model: torch.nn.Module) -> None:
    """Each decoder layer's projections as a Q4_K_M file mixes them: q and k Q8_0 (int8, fp16
    scales), v and down int8 with fp32 scales per 16 (Q6_K's layout), o int4 with fp32 scales
    (Q4_K's), gate int4 (Q4_1), up Q8_0: q, k, v and gate, up in parts of different kinds.
    Steps and scales are drawn, the same for every engine that loads the model."""
    from engine.model.int4 import Int4Linear, Int8Linear, _quantize
    g = torch.Generator().manual_seed(5)
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        for owner, name, kind in ((attn, "q_proj", "q8_0"), (attn, "k_proj", "q8_0"), (attn, "v_proj", "sub16"),
                                  (attn, "o_proj", "q4_k"), (mlp, "gate_proj", "q4_1"), (mlp, "up_proj", "q8_0"),
                                  (mlp, "down_proj", "sub16")):
            linear = torch.nn.Linear(getattr(owner, name).in_features, getattr(owner, name).out_features,
                                     bias=getattr(owner, name).bias is not None)
            if linear.bias is not None:
                linear.bias = getattr(owner, name).bias
            out, width = linear.out_features, linear.in_features
            if kind == "q4_k":
                scale = torch.rand(out, width // 32, generator=g) * 0.05 + 1e-3
                steps = torch.randint(0, 16, (out, width), generator=g, dtype=torch.int32)
                new: torch.nn.Module = Int4Linear(linear, steps, scale, -8 * scale, wide=True)
            elif kind == "sub16":
                steps = torch.randint(-32, 32, (out, width), generator=g, dtype=torch.int8)
                new = Int8Linear(linear, (steps, torch.rand(out, width // 16, generator=g) * 0.01 + 1e-4, None))
            elif kind == "q8_0":
                new = Int8Linear(linear, (*q8_0(torch.randn(out, width, generator=g) * 0.2), None))
            else:
                steps, scale, low, _ = _quantize(torch.randn(out, width, generator=g) * 0.2)
                new = Int4Linear(linear, steps, scale, low)
            setattr(owner, name, new)


@pytest.mark.parametrize("style", ["qwen2", "gemma3_text"])
async def test_every_block_kind_runs_in_the_whole_c_layers(models_dir, make_engine, monkeypatch, style):
    """Projections of every product's kind, mixed within q, k, v and within gate, up, as a Q4_K_M
    file has them: whole C layers give transformers' layers' numbers (around the same products)
    bit for bit, greedy and seeded, and batched equals alone."""
    from engine.model import loader
    from engine.model import plan as plans
    from testing.native_reference import reference_plan
    from tests.unit.test_batching import mixed_requests
    from tests.unit.test_int4 import _answers
    path = shared_build(models_dir / f"arch-{style}", style, four_bit=True)
    engines = {}
    for name, chosen in (("whole", plans.plan), ("modules", reference_plan)):
        monkeypatch.setattr(loader, "plan", lambda model, *rest, chosen=chosen: (_mixed_kinds(model),
                                                                                  chosen(model, *rest))[1])
        engines[name] = make_engine(path, device="cpu")
    model = engines["whole"].core.loaded.model
    stack = engines["whole"].core.loaded.plan.stack
    assert stack is not None and len(stack.layers) == model.config.num_hidden_layers
    kinds = {p.weights.kind for p in model.model.layers[0].modules() if hasattr(p, "weights")}
    assert len(kinds) == 4, kinds  # every product's kind
    requests = mixed_requests(4, seed=3) + mixed_requests(4, seed=4, sample=True)
    answers = await _answers(engines["whole"], requests)
    assert answers == await _answers(engines["modules"], requests) and all(ids for ids, _ in answers)
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logprobs=True)
    def flat(outs: list) -> tuple[list[int], list[float]]:
        return [t for o in outs for t in o.token_ids], [lp for o in outs for lp in o.logprobs]
    alone = [flat(await engines["whole"].complete(p, params)) for p in PROMPTS]
    together = await asyncio.gather(*(engines["whole"].complete(p, params) for p in PROMPTS))
    assert [flat(outs) for outs in together] == alone


@pytest.mark.parametrize("name", ["gemma3_text", "mistral"])
async def test_window_layers_keep_only_their_window(models_dir, make_engine, name):
    """Gemma 3's local layers and Mistral's (a window of 8 keys here) keep their keys in a window
    pool sized for the rows that may run, not for their lengths: two rows whose tables need 20
    blocks run in a window pool of 12 (each row's window and the step's new tokens), preempted by
    nothing, each answering as it does alone."""
    path = shared_build(models_dir / f"arch-{name}", name, four_bit=True)
    engine = make_engine(path, device="cpu", max_running=2, max_prefill_tokens=16)
    kv = engine.core.kv
    window = kv.groups[-1]  # the window layers' group
    assert len(kv.groups) == 2 and window.total == 12 < kv.blocks.total
    assert server_info(engine, name).kv_window_tokens == 12 * 16  # what /info reports
    params = SamplingParams(max_tokens=120, temperature=0, ignore_eos=True, logprobs=True)

    async def answer(prompt: str) -> tuple[list[int], list[float]]:
        outs = await engine.complete(prompt, params)
        return [t for o in outs for t in o.token_ids], [lp for o in outs for lp in o.logprobs]

    alone = [await answer(p) for p in PROMPTS[:2]]
    assert sum(-(-(len(engine.tokenizer(p).input_ids) + 120) // 16) for p in PROMPTS[:2]) >= 20
    together = await asyncio.gather(*(answer(p) for p in PROMPTS[:2]))
    assert list(together) == alone and all(len(tokens) == 120 for tokens, _ in alone)
    # n answers fork from the prompt, each copying its partly filled last block in both pools:
    # answer i seeded s is what a request seeded s + i gives alone
    sampled = dict(max_tokens=40, do_sample=True, temperature=1.5, ignore_eos=True)
    assert len(engine.tokenizer(PROMPTS[1]).input_ids) % 16
    answers: dict[int, list[int]] = {}
    for out in await engine.complete(PROMPTS[1], SamplingParams(n=2, seed=7, **sampled)):
        answers.setdefault(out.choice, []).extend(out.token_ids)
    singles = [[t for o in await engine.complete(PROMPTS[1], SamplingParams(seed=7 + i, **sampled))
                for t in o.token_ids] for i in range(2)]
    assert [answers[0], answers[1]] == singles and singles[0] != singles[1]
    assert engine.core.stats()["preemptions"] == 0 and not window.readers
