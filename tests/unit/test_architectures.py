"""Today's small architectures (testing/toy_models.ARCHITECTURES: Qwen2, Qwen3, Mistral, Phi-3,
Gemma 3), tiny and random, built from their transformers configs with no download, served with
int4 weights and the fp16 KV cache: transformers' modules around the C products and the C paged
attention (the whole-layer C path is Llama's). Each keeps the engine's promises: a request
batched with others answers as it does alone, and a prompt served from the prefix cache answers
as it did uncached."""
import asyncio

import pytest

from contract import SamplingParams
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
