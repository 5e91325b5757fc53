"""Reasoning told apart by token ids (engine/policies/reasoning.py), with a tiny model whose chat
template opens a think block: the thoughts come apart from the answer, a budget forces the close
marker, a grammar constrains only the answer, and streamed, batched and speculated runs equal the
whole one alone."""
import asyncio
import json
import re

import pytest

from contract import EngineConfig, SamplingParams
from engine import AsyncEngine
from engine.policies.reasoning import ReasoningMarkers

ASK = json.dumps([{"role": "user", "content": "the quick brown fox"}])


@pytest.fixture(scope="module")
async def engine(thinking_model):
    made = AsyncEngine(EngineConfig(model=thinking_model))
    yield made
    made.shutdown()


async def answer(engine: AsyncEngine, messages: str = ASK, **kw):
    """The whole answer, and its streamed outputs (one per token)."""
    params = SamplingParams(**{"max_tokens": 16, "ignore_eos": True, **kw})
    stream = [out async for out in await engine.open("", params, messages)]
    [whole] = await engine.complete("", params, messages)
    return whole, stream


def test_the_markers_come_from_the_chat_template(engine, gpt2_model):
    markers = ReasoningMarkers.of(engine.tokenizer, "auto")
    assert markers is not None and engine.tokenizer.convert_ids_to_tokens([markers.open_id, markers.close_id]) == \
        ["<think>", "</think>"]
    assert ReasoningMarkers.of(engine.tokenizer, "off") is None
    from transformers import AutoTokenizer
    assert ReasoningMarkers.of(AutoTokenizer.from_pretrained(gpt2_model), "auto") is None  # no template, no markers


async def test_a_budget_ends_the_thinking_and_the_answer_follows_apart(engine):
    close = ReasoningMarkers.of(engine.tokenizer, "auto").close_id
    whole, stream = await answer(engine, reasoning_budget=5)
    assert whole.token_ids[5] == close and close not in whole.token_ids[:5]  # forced after five thoughts
    assert whole.logprobs[5] == 0.0  # it was the only choice
    assert whole.reasoning_tokens == 6  # the five thoughts and the close marker (the prompt opened the block)
    decode = engine.tokenizer.decode
    assert whole.reasoning == decode(whole.token_ids[:5]) and whole.reasoning
    assert whole.text == decode(whole.token_ids[6:]) and whole.text
    assert "".join(o.reasoning for o in stream) == whole.reasoning and "".join(o.text for o in stream) == whole.text
    assert [t for o in stream for t in o.token_ids] == whole.token_ids
    nothing = (await answer(engine, reasoning_budget=0))[0]
    assert nothing.token_ids[0] == close and nothing.reasoning == "" and nothing.text


async def test_without_a_budget_it_thinks_as_the_model_goes(engine):
    whole, _ = await answer(engine)
    assert whole.text == "" and whole.reasoning == engine.tokenizer.decode(whole.token_ids)  # never closed here


async def test_a_grammar_constrains_only_the_answer(engine):
    whole, _ = await answer(engine, reasoning_budget=4, regex="[0-9]{3}", ignore_eos=False, max_tokens=30)
    assert re.fullmatch("[0-9]{3}", whole.text), whole.text
    assert whole.reasoning and not re.fullmatch("[0-9]*", whole.reasoning)  # the thoughts are free
    free = (await answer(engine, reasoning_budget=6))[0]
    at = free.reasoning[0]  # a stop string that the thoughts hold: it holds only after the thinking
    stopped = (await answer(engine, reasoning_budget=6, stop=[at]))[0]
    assert stopped.reasoning == free.reasoning and at not in stopped.text


async def test_batched_sampled_and_speculated_equal_alone(engine):
    kw = {"reasoning_budget": 3, "max_tokens": 12}
    alone = (await answer(engine, **kw))[0]
    together = await asyncio.gather(*(engine.complete("", SamplingParams(ignore_eos=True, **kw), ASK)
                                      for _ in range(4)))
    assert all(o.token_ids == alone.token_ids and o.reasoning == alone.reasoning for [o] in together)
    drafted = (await answer(engine, speculative_tokens=4, **kw))[0]
    assert drafted.token_ids == alone.token_ids
    sampled = [(await answer(engine, do_sample=True, seed=7, **kw))[0] for _ in range(2)]
    assert sampled[0].token_ids == sampled[1].token_ids and sampled[0].token_ids[3] == alone.token_ids[3]


async def test_a_prompt_that_opens_no_think_block_is_answered_plainly(engine):
    params = SamplingParams(max_tokens=8, ignore_eos=True, reasoning_budget=2)
    [whole] = await engine.complete("the quick brown fox", params)  # no chat template: no block opened
    assert whole.reasoning == "" and whole.text == engine.tokenizer.decode(whole.token_ids)
