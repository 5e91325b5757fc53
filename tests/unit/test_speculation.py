"""Prompt-lookup speculative decoding: the drafts, and answers that do not change by a bit,
greedy and seeded, alone and batched beside rows that do not speculate, with the C kernels and
with PyTorch's fallbacks; stop sequences, max_tokens and log probabilities as without it."""
import asyncio

import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer

from contract import SamplingParams, ValidationError
from engine.core.kv_pool import KVPool, KVShape
from engine.kernels import build, native
from engine.model import paged_attention
from engine.model.int4 import _quantize, dequantize
from engine.policies.speculation import Acceptance, PromptLookup, StepCosts, worth
from tests.unit.test_paged_attention import step


@pytest.fixture(scope="module")
def looping_llama(llama_model, tmp_path_factory) -> str:
    """The tiny llama, 4-bit, whose output layer favours a dozen tokens: its answers repeat
    themselves enough for drafts to be both confirmed and refused (random weights never copy)."""
    model = AutoModelForCausalLM.from_pretrained(llama_model, dtype=torch.float32)
    head = model.get_output_embeddings()
    for module in model.modules():
        if type(module) is nn.Linear and module is not head:
            steps, scale, low, _ = _quantize(module.weight.detach())
            module.weight.data = dequantize(steps, scale, low)
    favoured = torch.zeros(head.weight.shape[0], dtype=torch.bool)
    favoured[300:312] = True
    head.weight.data[~favoured] *= 0.05
    path = tmp_path_factory.mktemp("looping_llama")
    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(llama_model).save_pretrained(path)
    return str(path)


def test_drafts_follow_the_latest_earlier_occurrence_of_the_longest_ngram():
    lookup = PromptLookup(ngram_min=1, ngram_max=3)
    history = [1, 2, 3, 9, 9, 1, 2, 3, 4, 5, 7, 1, 2, 3]
    assert lookup.propose(history, 3) == [4, 5, 7]  # "1 2 3" last came before "4 5 7"
    assert lookup.propose(history + [4], 2) == [5, 7]  # the index grows with the history
    assert lookup.propose([5, 6, 7], 4) == []  # nothing occurred before: no draft
    assert PromptLookup(1, 2).propose([8, 1, 8, 2, 8], 2) == [2, 8]  # n=1: the latest 8 was followed by 2


COPY = "fox dog fox dog fox dog"


async def answer(engine, prompt: str, **params):
    outs = [o async for o in engine.generate(prompt, SamplingParams(ignore_eos=True, **params))]
    return ([t for o in outs for t in o.token_ids], [lp for o in outs for lp in o.logprobs],
            "".join(o.text for o in outs), outs[-1].finish_reason)


@pytest.mark.parametrize("kernels", ["C", "fallback"])
async def test_speculation_changes_no_token_and_no_number(looping_llama, make_engine, monkeypatch, kernels):
    if kernels == "fallback":  # PyTorch's int4 kernel and one SDPA call per sequence, as without a compiler
        monkeypatch.setattr(build, "library", lambda: None)
    elif native.library() is None:
        pytest.skip("no C compiler")
    plain = make_engine(looping_llama, device="cpu", max_prefill_tokens=16, speculative_tokens=0)  # int4: CPU only
    fast = make_engine(looping_llama, device="cpu", max_prefill_tokens=16, speculative_tokens=0)
    assert fast.core.loaded.info.dtype == "int4"
    cases = [(COPY, {"max_tokens": 40}), (COPY, {"max_tokens": 40, "do_sample": True, "seed": 3, "top_k": 20}),
             (COPY, {"max_tokens": 7}), ("a b a b a b a b", {"max_tokens": 30, "top_logprobs": 3}),
             ("hello", {"max_tokens": 30, "repetition_penalty": 1.3}),
             ("the the the the the", {"max_tokens": 25, "do_sample": True, "seed": 11})]
    text = (await answer(plain, COPY, max_tokens=40))[2]
    cases.append((COPY, {"max_tokens": 40, "stop": [text[len(text) // 2:len(text) // 2 + 3]]}))
    alone = [await answer(plain, p, **kw) for p, kw in cases]
    assert alone[-1][3] == "stop_sequence"
    spec = [(p, {"speculative_tokens": 4, **kw}) for p, kw in cases]  # sampled rows too, as they ask
    assert [await answer(fast, p, **kw) for p, kw in spec] == alone
    assert await asyncio.gather(*(answer(fast, p, **kw) for p, kw in spec * 2)) == alone * 2  # 12 rows: some
    stats = fast.stats()                                                                      # steps speculate
    assert 0 < stats["spec_accepted_tokens"] < stats["spec_draft_tokens"]  # drafts confirmed, and refused
    assert plain.stats()["spec_drafts"] == 0
    off = await answer(fast, COPY, max_tokens=40, speculative_tokens=0)
    assert off == alone[0] and fast.stats()["spec_drafts"] == stats["spec_drafts"]


async def test_fp32_models_give_the_same_tokens(gpt2_model, make_engine):
    """PyTorch's fp32 matmuls round by shape: the same tokens, numbers within float rounding."""
    plain, fast = make_engine(gpt2_model), make_engine(gpt2_model, speculative_tokens=4)
    for prompt in ("the the the the the", "fox dog fox dog fox dog"):
        alone, spec = await answer(plain, prompt, max_tokens=60), await answer(fast, prompt, max_tokens=60)
        assert spec[0] == alone[0] and spec[1] == pytest.approx(alone[1], abs=1e-4)
    assert fast.stats()["spec_accepted_tokens"] > 0


async def test_speculation_saves_steps_where_the_answer_copies(looping_llama, make_engine):
    engine = make_engine(looping_llama, speculative_tokens=8)
    before = engine.core.steps
    await answer(engine, COPY, max_tokens=60)
    steps = engine.core.steps - before
    accepted = engine.stats()["spec_accepted_tokens"]
    assert accepted > 0 and steps <= 61 - accepted  # each accepted draft is a step not taken


async def test_by_default_greedy_requests_speculate_and_sampled_ones_when_they_ask(looping_llama, make_engine):
    engine = make_engine(looping_llama)  # the server's default
    sampled = {"max_tokens": 25, "do_sample": True, "seed": 11, "temperature": 0.2}  # repeats: drafts to check
    await answer(engine, "the the the the the", **sampled)
    assert engine.stats()["spec_drafts"] == 0
    await answer(engine, "the the the the the", **sampled, speculative_tokens=4)
    asked = engine.stats()["spec_drafts"]
    assert asked > 0
    await answer(engine, COPY, max_tokens=20)
    assert engine.stats()["spec_drafts"] > asked


async def test_grammars_do_not_speculate_and_limits_are_checked(looping_llama, make_engine):
    engine = make_engine(looping_llama, speculative_tokens=4)
    await answer(engine, COPY, max_tokens=20, regex="[a-z ]{5,30}")
    assert engine.stats()["spec_drafts"] == 0
    with pytest.raises(ValidationError) as err:
        SamplingParams(speculative_tokens=17).validate(100)
    assert err.value.field == "speculative_tokens"


def test_the_per_sequence_path_computes_drafts_as_decode_steps(monkeypatch):
    """Without the C kernel, a row's last token and drafts go one SDPA call each."""
    calls = []
    real = paged_attention.F.scaled_dot_product_attention

    def spy(q, *args, **kwargs):
        calls.append(q.shape[2])
        return real(q, *args, **kwargs)
    monkeypatch.setattr(paged_attention.F, "scaled_dot_product_attention", spy)
    query, k_pool, v_pool, tables, q_lens, ctx_lens = step([(40, 5), (300, 200)], 4, 2, 16)
    pool = KVPool(KVShape(1, 2, 16, torch.float32), k_pool.shape[0] - 1, torch.device("cpu"))
    pool.keys[0], pool.values[0] = k_pool, v_pool
    paged = paged_attention.PagedStep(pool, torch.zeros(0, dtype=torch.long), q_lens, ctx_lens, tables)
    paged_attention._per_sequence(query, 0, paged, 0.25, 0, 0.0)
    assert calls == [1, 1, 1, 1, 1, 200]


def test_drafts_are_checked_only_as_far_as_they_pay():
    flat = lambda k: 1.0 + 0.05 * k  # noqa: E731 - a cheap verify: a few drafts pay at a middling rate
    steep = lambda k: 1.0 + 0.5 * k  # noqa: E731 - each draft costs half a step
    assert worth(8, 0.9, flat) == 8 and worth(8, 0.5, flat) >= 2
    assert worth(8, 0.2, steep) == 0 and worth(8, 0.9, steep) >= 1
    assert worth(0, 0.9, flat) == 0
    # four rows share the step: a draft that pays for one row alone slows the other three
    middling = lambda k: 1.0 + 0.2 * k  # noqa: E731
    assert worth(8, 0.5, middling, rows=1) >= 1 and worth(8, 0.5, middling, rows=4) == 0
    assert worth(8, 0.9, flat, rows=4) >= 1  # a row that copies still pays its way


def test_acceptance_and_step_costs_are_what_was_measured():
    acceptance = Acceptance()
    assert acceptance.rate() == 0.5  # one of each to start from
    acceptance.record(drafted=4, accepted=4)
    acceptance.record(drafted=4, accepted=1)
    assert (acceptance.accepted, acceptance.refused) == (5, 1) and acceptance.rate() == 6 / 8
    costs = StepCosts()
    assert costs.ratio(1, 4) == 1.2  # unmeasured: optimistic, so it gets tried
    costs.record(1, 0.010)
    costs.record(5, 0.020)
    assert costs.ratio(1, 4) == pytest.approx(2.0)
    for _ in range(300):  # the five-position size not measured for long: tried again
        costs.record(1, 0.010)
    assert costs.ratio(1, 4) == 1.2


async def test_the_servers_default_stops_drafting_where_drafts_do_not_pay(looping_llama, make_engine):
    """Steps that cost twice a plain one per draft: a row on the server's default drafts nothing,
    a request that names its own number drafts as it asked; the tokens are the same."""
    engine = make_engine(looping_llama, speculative_tokens=8)
    engine.core.scheduler.costs.ratio = lambda base, extra: 1.0 + 2.0 * extra  # type: ignore[method-assign]
    plain = await answer(engine, COPY, max_tokens=40)
    assert engine.stats()["spec_drafts"] == 0
    asked = await answer(engine, COPY, max_tokens=40, speculative_tokens=8)
    assert engine.stats()["spec_drafts"] > 0 and asked[0] == plain[0]
