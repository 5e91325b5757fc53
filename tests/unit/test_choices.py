"""Several answers per request (n) and prompt scores (prompt_logprobs) in the engine: one
prefill shared by n rows that decode as separate requests would, and prompt numbers equal to a
direct forward pass, whatever the chunking or the neighbours."""
import asyncio

import pytest
import torch

from contract import SamplingParams, ValidationError
from tests.unit.test_int4 import four_bit_llama  # noqa: F401 - the fixture
from tests.unit.test_logprobs import PROMPT, run

LONG = " ".join(["the quick brown fox jumps over the lazy dog"] * 4)


def by_choice(outs) -> dict[int, list[int]]:
    answers: dict[int, list[int]] = {}
    for out in outs:
        answers.setdefault(out.choice, []).extend(out.token_ids)
    return answers


async def test_n_answers_equal_separate_requests_seeded_one_apart(any_model, make_engine):
    """Answer i of a request seeded s is what a request seeded s + i gives alone: sharing the
    prefill changes nothing, and the answers differ from each other."""
    engine = make_engine(any_model)
    params = dict(max_tokens=10, do_sample=True, temperature=1.5, ignore_eos=True)
    outs = await run(engine, SamplingParams(n=3, seed=100, **params))
    answers = by_choice(outs)
    alone = [[t for o in await run(engine, SamplingParams(seed=100 + i, **params)) for t in o.token_ids]
             for i in range(3)]
    assert [answers[i] for i in range(3)] == alone
    assert len({tuple(a) for a in alone}) == 3
    finals = [o for o in outs if o.finish_reason is not None]
    assert sorted(o.choice for o in finals) == [0, 1, 2] and [o.seed for o in sorted(finals, key=lambda o: o.choice)] \
        == [100, 101, 102]
    again = by_choice(await run(engine, SamplingParams(n=3, seed=100, **params)))
    assert again == answers  # reproducible


async def test_greedy_n_gives_equal_answers_and_complete_splits_them(gpt2_model, make_engine):
    engine = make_engine(gpt2_model)
    outs = await engine.complete(PROMPT, SamplingParams(n=2, max_tokens=6, ignore_eos=True))
    assert [o.choice for o in outs] == [0, 1] and outs[0].token_ids == outs[1].token_ids and outs[0].text
    assert all(o.generated_tokens == 6 for o in outs)


async def test_n_rows_are_counted_and_refused_naming_n(gpt2_model, make_engine):
    engine = make_engine(gpt2_model, max_running=4, max_batch_tokens=200)
    for n in (5, 4):  # 5 rows > max_running; 4 x (prompt + 60) > 200 tokens
        with pytest.raises(ValidationError) as err:
            await engine.open(PROMPT, SamplingParams(n=n, max_tokens=60))
        assert err.value.field == "n"
    with pytest.raises(ValidationError) as err:
        await engine.open(PROMPT, SamplingParams(n=17))
    assert err.value.field == "n"
    await engine.complete(PROMPT, SamplingParams(n=4, max_tokens=10))  # fits


async def test_cancelling_ends_every_answer(gpt2_model, make_engine):
    engine = make_engine(gpt2_model)
    stream = await engine.open(PROMPT, SamplingParams(n=3, max_tokens=500, ignore_eos=True))
    async for _ in stream:
        break
    await stream.aclose()
    for _ in range(100):
        stats = engine.stats()
        if stats["running"] == stats["running"] == stats["kv_blocks_used"] == 0:
            break
        await asyncio.sleep(0.02)
    assert (stats["running"], stats["running"], stats["kv_blocks_used"]) == (0, 0, 0)
    assert stats["steps"] < 100


def direct_prompt_scores(engine, prompt: str, top_n: int) -> tuple[list[float], list[list[int]]]:
    ids = engine.tokenizer(prompt)["input_ids"]
    with torch.no_grad():
        rows = torch.log_softmax(engine.core.loaded.model(torch.tensor([ids])).logits[0].float(), -1)
    logprobs = [float(rows[k, t]) for k, t in enumerate(ids[1:])]
    return logprobs, [rows[k].topk(top_n).indices.tolist() for k in range(len(ids) - 1)]


@pytest.mark.parametrize("chunk", [512, 7], ids=["whole", "chunked"])
async def test_prompt_logprobs_equal_a_direct_forward_pass(any_model, make_engine, chunk):
    engine = make_engine(any_model, max_prefill_tokens=chunk)
    outs = await run(engine, SamplingParams(max_tokens=3, prompt_logprobs=True, top_logprobs=3), prompt=LONG)
    scores = outs[0].prompt
    assert scores is not None and all(o.prompt is None for o in outs[1:])
    logprobs, top = direct_prompt_scores(engine, LONG, 3)
    assert scores.token_ids == engine.tokenizer(LONG)["input_ids"] and len(scores.logprobs) == len(scores.token_ids) - 1
    assert scores.logprobs == pytest.approx(logprobs, abs=1e-4)
    assert [[i for i, _, _ in alts] for alts in scores.alternatives] == top
    assert scores.texts[1] == engine.tokenizer.decode([scores.token_ids[1]])


@pytest.mark.parametrize("weights", ["int4", "fp32"])
async def test_prompt_logprobs_do_not_depend_on_neighbours(four_bit_llama, gpt2_model, make_engine,  # noqa: F811
                                                           weights):
    """Alone, or prefilled in a group with other prompts: the same numbers and the same
    answer (bit for bit on the C kernels, within rounding on the fp32 fallback); asking for
    them does not change the answer."""
    engine = make_engine(four_bit_llama if weights == "int4" else gpt2_model)
    asked = SamplingParams(max_tokens=8, prompt_logprobs=True, ignore_eos=True)
    alone = await run(engine, asked)
    others = [run(engine, SamplingParams(max_tokens=8, ignore_eos=True), prompt=PROMPT + " and" * k) for k in range(3)]
    together = (await asyncio.gather(run(engine, asked), *others))[0]
    plain = await run(engine, SamplingParams(max_tokens=8, ignore_eos=True))
    tokens = [[t for o in outs for t in o.token_ids] for outs in (alone, together, plain)]
    assert tokens[0] == tokens[1] == tokens[2]
    if weights == "int4":
        assert together[0].prompt == alone[0].prompt
    else:
        assert together[0].prompt.logprobs == pytest.approx(alone[0].prompt.logprobs, abs=1e-5)


async def test_max_tokens_zero_scores_the_prompt_only(gpt2_model, make_engine):
    engine = make_engine(gpt2_model)
    [out] = await engine.complete(PROMPT, SamplingParams(max_tokens=0, prompt_logprobs=True))
    assert out.token_ids == [] and out.finish_reason.value == "length" and out.generated_tokens == 0
    assert out.prompt is not None and out.prompt.logprobs == pytest.approx(direct_prompt_scores(engine, PROMPT, 1)[0],
                                                                           abs=1e-4)
    assert engine.stats()["kv_blocks_used"] == 0
    with pytest.raises(ValidationError) as err:
        await engine.open(PROMPT, SamplingParams(max_tokens=0))
    assert err.value.field == "max_tokens"
