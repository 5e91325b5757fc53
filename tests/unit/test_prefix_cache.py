"""Automatic prefix caching: a repeated prompt, a shared prefix and a conversation's next turn
reuse cached KV and prefill only the rest, and the answers are those of an engine without the
cache: bit for bit on the C kernels (tokens and log probabilities), the same tokens within
float rounding on the fallbacks."""
import asyncio
import json

import pytest

from contract import SamplingParams
from engine.model import paged_attention
from tests.unit.test_int4 import four_bit_llama  # noqa: F401 - the fixture

SYSTEM = "the system prompt says: " + " ".join(f"rule {i} is to be kind." for i in range(12))
QUESTIONS = ["what is a fox?", "and a dog?", "which is faster?"]


async def answer(engine, messages: list[dict], **params):
    outs = [o async for o in await engine.open("", SamplingParams(max_tokens=12, **params),
                                                messages=json.dumps(messages))]
    return [t for o in outs for t in o.token_ids], [lp for o in outs for lp in o.logprobs], outs[-1]


async def conversation(engine, **params) -> list[tuple]:
    """Three turns, each resending the history with the previous answer."""
    messages, turns = [{"role": "system", "content": SYSTEM}], []
    for question in QUESTIONS:
        messages.append({"role": "user", "content": question})
        tokens, logprobs, last = await answer(engine, messages, **params)
        messages.append({"role": "assistant", "content": engine.tokenizer.decode(tokens, skip_special_tokens=True)})
        turns.append((tokens, logprobs, last.prompt_tokens, last.cached_tokens))
    return turns


@pytest.mark.parametrize("kernels", ["C", "fallback"])
@pytest.mark.parametrize("weights", ["int4", "fp32"])
async def test_a_conversation_reuses_its_history_and_answers_as_without_the_cache(
        four_bit_llama, gpt2_model, make_engine, monkeypatch, weights, kernels):  # noqa: F811
    if kernels == "fallback":  # one SDPA call per sequence, as where no C compiler is found
        monkeypatch.setattr(paged_attention, "c_paged_attention", lambda *args: None)
    model = four_bit_llama if weights == "int4" else gpt2_model
    cached, plain = make_engine(model), make_engine(model, prefix_caching=False)
    for params in ({}, {"do_sample": True, "seed": 5}):
        with_cache, without = await conversation(cached, **params), await conversation(plain, **params)
        assert [t[0] for t in with_cache] == [t[0] for t in without]
        assert all(t[3] == 0 for t in without) and with_cache[-1][3] > with_cache[-1][2] // 2
        if kernels == "C":  # the C kernels (int4, and fp32's products): bit for bit
            assert with_cache == [t[:3] + (w[3],) for t, w in zip(without, with_cache, strict=True)]
        else:
            assert [lp for t in with_cache for lp in t[1]] == pytest.approx([lp for t in without for lp in t[1]],
                                                                             abs=1e-4)


async def test_shared_prefix_under_any_batch_and_a_repeat(four_bit_llama, make_engine):  # noqa: F811
    """Requests sharing a system prompt, together and alone, with the cache and without:
    the same answers bit for bit; a repeated prompt reuses all but its last token's block."""
    cached, plain = make_engine(four_bit_llama), make_engine(four_bit_llama, prefix_caching=False)
    prompts = [[{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}] for q in QUESTIONS]
    reference = [await answer(plain, p) for p in prompts]
    await answer(cached, prompts[0])  # warms the system prompt's blocks
    together = await asyncio.gather(*(answer(cached, p) for p in prompts))
    assert [t[:2] for t in together] == [r[:2] for r in reference]
    assert all(t[2].cached_tokens >= 16 for t in together)
    again = await answer(cached, prompts[0])
    assert again[:2] == reference[0][:2]
    assert again[2].prompt_tokens - 16 <= again[2].cached_tokens < again[2].prompt_tokens
    for _ in range(50):  # the last row leaves the batch right after its last token went out
        stats = cached.stats()
        if stats["running"] == 0:
            break
        await asyncio.sleep(0.01)
    assert stats["prefix_cache_hits"] > 0 and stats["prefix_cache_blocks"] > 0
    assert stats["running"] == stats["kv_blocks_used"] == stats["running"] == 0


async def test_prompt_scores_cover_the_whole_prompt_cached_or_not(four_bit_llama, make_engine):  # noqa: F811
    engine = make_engine(four_bit_llama)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}]
    _, _, cold = await answer(engine, messages, prompt_logprobs=True)
    _, _, warm = await answer(engine, messages)
    _, _, scored = await answer(engine, messages, prompt_logprobs=True)
    assert warm.cached_tokens > 0 and scored.cached_tokens == 0
    first = [o async for o in await engine.open("", SamplingParams(max_tokens=1, prompt_logprobs=True),
                                                 messages=json.dumps(messages))][0]
    assert len(first.prompt.logprobs) == first.prompt_tokens - 1


async def test_prompts_sent_together_compute_their_shared_prefix_once(four_bit_llama, make_engine):  # noqa: F811
    cached, plain = make_engine(four_bit_llama), make_engine(four_bit_llama, prefix_caching=False)
    prompts = [[{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}] for q in QUESTIONS]
    together = await asyncio.gather(*(answer(cached, p) for p in prompts))
    assert [t[:2] for t in together] == [(await answer(plain, p))[:2] for p in prompts]
    assert together[0][2].cached_tokens == 0 and all(t[2].cached_tokens >= 32 for t in together[1:])
