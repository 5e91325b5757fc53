"""Decode steps replayed from CUDA graphs (cuda_graphs.py).

On the CPU, DecodeGraphs runs its fixed-shape steps eagerly over the same buffers (no capture):
the padding, the tables, the mask and the attention over them are checked here against the
engine's own steps. The tests marked `gpu` capture and replay real graphs (make test-gpu)."""
import asyncio
import dataclasses

import pytest
import torch

from contract import EngineConfig, SamplingParams
from engine.model.cuda_graphs import DecodeGraphs, bucket
from tests.unit.test_batching import collect, mixed_requests, settled

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def with_fixed_shapes(engine) -> DecodeGraphs:
    """The engine's decode steps through DecodeGraphs, run eagerly (a CPU has nothing to capture).
    The pool starts zero, as on a GPU: a fixed-width read meets unwritten slots, masked, and
    a CPU pool's are left as the OS gives them (maybe NaN, which a zero weight keeps)."""
    core = engine.core
    core.kv.pool.keys.zero_()
    core.kv.pool.values.zero_()
    graphs = DecodeGraphs(core.loaded.model, core.kv.pool, core.config.max_running, core.loaded.max_context,
                          capture=False)
    core.runner.graphs = graphs
    return graphs


async def answers(engine, requests) -> list:
    return await asyncio.gather(*(collect(engine, p, params) for p, params in requests))


def test_shapes_are_powers_of_two_up_to_the_limit():
    assert [bucket(n, 32) for n in (1, 2, 3, 5, 16, 17, 31, 32)] == [1, 2, 4, 8, 16, 32, 32, 32]
    assert bucket(33, 48) == 48 and bucket(7, 6) == 6


def test_graphs_only_on_cuda_when_asked_and_without_sliding_windows(llama_model):
    from engine.model.loader import load_model
    config = EngineConfig(model=llama_model, device="cpu")
    loaded = load_model(config)
    pool = object()
    assert DecodeGraphs.for_model(loaded, pool, config) is None  # type: ignore[arg-type] # the CPU
    on_gpu = dataclasses.replace(loaded, device=torch.device("cuda", 0))
    assert DecodeGraphs.for_model(on_gpu, pool, dataclasses.replace(config, cuda_graphs=False)) is None
    loaded.model.config.sliding_window = 64
    try:
        assert DecodeGraphs.for_model(on_gpu, pool, config) is None
    finally:
        loaded.model.config.sliding_window = None
    assert EngineConfig.from_env({"LLM_CUDA_GRAPHS": "0"}) == {"cuda_graphs": False}


async def test_fixed_shape_steps_give_the_engines_own_answers(any_model, make_engine):
    """Rows padded to powers of two, tables to a fixed width and masked: the same tokens, text and
    finish for 12 mixed requests at once, and no block left held."""
    requests = mixed_requests(12)
    plain = make_engine(any_model, device="cpu", max_prefill_tokens=16)
    fixed = make_engine(any_model, device="cpu", max_prefill_tokens=16)
    graphs = with_fixed_shapes(fixed)
    expected, got = await answers(plain, requests), await answers(fixed, requests)
    assert graphs.replays > 0 and len({rows for rows, _, _ in graphs.captured}) > 2
    for (ids, text, reason), (ids2, text2, reason2) in zip(expected, got, strict=True):
        assert (ids2, text2, reason2) == (ids, text, reason)
    assert (await settled(plain))["kv_blocks_used"] == (await settled(fixed))["kv_blocks_used"] == 0


async def test_drafts_go_through_fixed_shapes_and_change_no_answer(any_model, make_engine):
    """Greedy streams speculate (prompt lookup): the steps that check their drafts run through
    DecodeGraphs too, each row's queries padded to a power of two, and the answers are those of an
    engine that does not speculate, with several tokens to a step where drafts held."""
    prompts = ["a lazy dog while streams of tokens flow " * 6, "the quick brown fox " * 5]
    # 8 drafts each, as asked (the server's default drafts only what pays, which on random weights is little)
    params = SamplingParams(max_tokens=60, ignore_eos=True, speculative_tokens=8)
    requests = [(p, params) for p in prompts]
    plain = make_engine(any_model, device="cpu", speculative_tokens=0)
    fixed = make_engine(any_model, device="cpu", speculative_tokens=8)
    graphs = with_fixed_shapes(fixed)
    expected = await answers(plain, [(p, SamplingParams(max_tokens=60, ignore_eos=True)) for p in prompts])
    assert await answers(fixed, requests) == expected
    assert any(queries > 1 for _, queries, _ in graphs.captured)
    assert fixed.stats()["spec_accepted_tokens"] > 0, fixed.stats()  # steps that took several tokens
    assert {queries for _, queries, _ in graphs.captured} <= {1, 2, 4, 8, 16}  # 9: 1 + 8 drafts
    assert (await settled(fixed))["kv_blocks_used"] == 0


async def test_fixed_shape_steps_keep_log_probabilities(llama_model, make_engine):
    """The same tokens, log probabilities to float32's rounding (the keys' widths differ, so their
    sums' order) and the same alternatives."""
    params = SamplingParams(max_tokens=30, ignore_eos=True, logprobs=True, top_logprobs=3)
    plain = make_engine(llama_model, device="cpu")
    fixed = make_engine(llama_model, device="cpu")
    graphs = with_fixed_shapes(fixed)
    prompts = ["the quick brown fox", "a lazy dog while streams of tokens flow " * 4]
    for prompt in prompts:
        want = [c async for c in plain.generate(prompt, params)]
        got = [c async for c in fixed.generate(prompt, params)]
        assert [t for c in got for t in c.token_ids] == [t for c in want for t in c.token_ids]
        got_lp, want_lp = ([lp for c in chunks for lp in c.logprobs] for chunks in (got, want))
        assert got_lp == pytest.approx(want_lp, abs=1e-4) and len(got_lp) == 30
        got_top, want_top = ([[a[0] for a in alt] for c in chunks for alt in c.alternatives] for chunks in (got, want))
        assert got_top == want_top
    assert graphs.replays > 0


# ----- on a GPU: real captures -----
@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("sample", [False, True], ids=["greedy", "seeded"])
async def test_replayed_steps_give_the_eager_answers_and_batched_equals_alone(any_model, make_engine, sample):
    """fp32 on the GPU: the graphs' answers are eager's; and batched equals alone with graphs on."""
    requests = mixed_requests(20, sample=sample)
    eager = make_engine(any_model, dtype="fp32", max_prefill_tokens=16, cuda_graphs=False)
    graphed = make_engine(any_model, dtype="fp32", max_prefill_tokens=16)
    graphs = graphed.core.runner.graphs
    assert graphs is not None and eager.core.runner.graphs is None
    together = await answers(graphed, requests)
    assert graphs.replays > 0 and graphs.failed is None and all(c.graph for c in graphs.captured.values())
    assert together == await answers(eager, requests)
    alone = [await collect(graphed, p, params) for p, params in requests]
    assert together == alone


@pytest.mark.gpu
@needs_cuda
async def test_replayed_steps_check_drafts_as_eager_steps_do(any_model, make_engine):
    """fp32 on the GPU: steps that check speculative drafts replay graphs too, with eager's answers."""
    params = SamplingParams(max_tokens=60, ignore_eos=True)
    requests = [("a lazy dog while streams of tokens flow " * 6, params), ("the quick brown fox " * 5, params)]
    eager = make_engine(any_model, dtype="fp32", cuda_graphs=False, speculative_tokens=8)
    graphed = make_engine(any_model, dtype="fp32", speculative_tokens=8)
    assert await answers(graphed, requests) == await answers(eager, requests)
    graphs = graphed.core.runner.graphs
    assert graphs.failed is None and any(queries > 1 and c.graph for (_, queries, _), c in graphs.captured.items())


@pytest.mark.gpu
@needs_cuda
async def test_a_failed_capture_leaves_the_engine_eager_and_answering(gpt2_model, make_engine, monkeypatch):
    engine = make_engine(gpt2_model, dtype="fp32")
    expected = await collect(make_engine(gpt2_model, dtype="fp32", cuda_graphs=False), "the quick brown",
                             SamplingParams(max_tokens=12, ignore_eos=True))

    def refuse(*args, **kwargs):
        raise RuntimeError("capture refused")
    monkeypatch.setattr(torch.cuda, "CUDAGraph", refuse)
    assert await collect(engine, "the quick brown", SamplingParams(max_tokens=12, ignore_eos=True)) == expected
    graphs = engine.core.runner.graphs
    assert graphs.failed and "capture refused" in graphs.failed and not graphs.captured


@pytest.mark.gpu
@needs_cuda
async def test_a_long_stream_crosses_widths_and_the_bf16_default_batches_as_alone(llama_model, make_engine):
    """The service's default dtype on a GPU (bf16): graphs of growing widths, batched == alone."""
    engine = make_engine(llama_model, max_prefill_tokens=16)
    long = ("the quick brown fox", SamplingParams(max_tokens=150, ignore_eos=True))
    requests = [long, *mixed_requests(8)]
    together = await answers(engine, requests)
    alone = [await collect(engine, p, params) for p, params in requests]
    graphs = engine.core.runner.graphs
    assert together == alone and len({width for _, _, width in graphs.captured}) >= 3
