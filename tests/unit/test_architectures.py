"""Today's small architectures (testing/toy_models.ARCHITECTURES: Qwen2, Qwen3, Mistral, Phi-3,
Gemma 3, Gemma 2), tiny and random, built from their transformers configs with no download, served
with int4 weights and the fp16 KV cache, every one in whole C layers (llama_layer.c). Each
gives transformers' own log probabilities (its eager forward, fp32) within a stated tolerance, and
keeps the engine's promises: a request batched with others answers as it does alone, and a prompt
served from the prefix cache answers as it did uncached."""
import asyncio

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from contract import SamplingParams
from engine.model.int4 import q8_0
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


def test_the_load_says_why_layers_run_outside_the_c_layers(architecture_model, caplog):
    from contract import EngineConfig
    from engine.model.loader import load_model
    with caplog.at_level("INFO", logger="engine.model.loader"):
        loaded = load_model(EngineConfig(model=architecture_model, device="cpu"))
    assert loaded.info.dtype == "int4"
    lines = [r.getMessage() for r in caplog.records if "decoder layers:" in r.getMessage()]
    # every layer in llama_layer.c, the stack in one call
    assert not lines and getattr(loaded.model, "lean_stack", None) is not None, lines


@pytest.mark.parametrize("whole_layers, style", [*((True, s) for s in (*KIN, *GEMMA)), *((False, s) for s in KIN)],
                         ids=lambda v: {True: "llama_layer.c", False: "python"}.get(v, v))
async def test_whole_layers_give_the_numbers_of_transformers_layers(models_dir, make_engine, monkeypatch,
                                                                   whole_layers, style):
    """Qwen2's biases, Qwen3's q and k norms, Mistral's window, Phi-3's fused projections, and
    Gemma's norms around each sublayer, (1 + w) norms, GeGLU, capped scores and local and global
    rotary tables, in llama_layer.c's whole layers (and, for Llama's kin, in fast_layers.py's
    Python layers where those do not run): the same tokens and log probabilities as transformers'
    own layers (with the C norms and activations), bit for bit, greedy and seeded."""
    from engine.model import fast_layers
    from tests.unit.test_int4 import _answers, _lean_and_full
    kin_model = shared_build(models_dir / f"arch-{style}", style, four_bit=True)
    if not whole_layers:
        monkeypatch.setattr(fast_layers, "_native", lambda *layer: None)
    lean, full, requests = _lean_and_full(kin_model, make_engine, monkeypatch)
    layers = [m for m in lean.core.loaded.model.modules() if hasattr(m, "lean_qkv")]
    assert layers and all(bool(m.lean_native) == whole_layers for m in layers)
    answers = await _answers(lean, requests)
    assert answers == await _answers(full, requests) and all(ids for ids, _ in answers)
