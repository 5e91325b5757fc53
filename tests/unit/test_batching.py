"""Continuous batching in the engine, without Jina: isolation, limits, cancellation, faults."""
import asyncio
import random
import time

import pytest

from contract import (
    EngineConfig,
    FinishReason,
    GenerationError,
    OverloadedError,
    RequestFailedError,
    SamplingParams,
    ValidationError,
)
from engine import AsyncEngine

WORDS = "the quick brown fox jumps over a lazy dog while streams of tokens flow 東京 café".split()


def mixed_requests(n: int, seed: int = 0, sample: bool = False) -> list[tuple[str, SamplingParams]]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        prompt = " ".join(rng.choices(WORDS, k=rng.randint(1, 40)))
        params = SamplingParams(max_tokens=rng.randint(4, 40), ignore_eos=True)
        if i % 3 == 0:
            params.stop = [rng.choice(["e", " t", "at", "東"])]
        if sample:
            params.do_sample, params.seed, params.top_k, params.temperature = True, 100 + i, 50, 1.2
        out.append((prompt, params))
    return out


async def collect(engine: AsyncEngine, prompt: str, params: SamplingParams, delay: float = 0.0):
    ids, text, last = [], "", None
    async for chunk in engine.generate(prompt, params):
        ids += chunk.token_ids
        text += chunk.text
        last = chunk
        if delay:
            await asyncio.sleep(delay)
    return ids, text, last.finish_reason


async def settled(engine: AsyncEngine) -> dict:
    """Stats once the loop has finished its current step (outputs go out before cleanup)."""
    for _ in range(200):
        stats = engine.stats()
        if stats["running"] == stats["running"] == stats["prefilling"] == 0:
            break
        await asyncio.sleep(0.01)
    return engine.stats()


@pytest.mark.parametrize("sample", [False, True], ids=["greedy", "seeded"])
async def test_batched_output_equals_output_alone(any_model, make_engine, sample):
    """12 concurrent requests, mixed prompt lengths, max_tokens and stops: same tokens as alone."""
    engine = make_engine(any_model, max_prefill_tokens=16)
    requests = mixed_requests(12, sample=sample)
    alone = [await collect(engine, p, params) for p, params in requests]
    together = await asyncio.gather(*(collect(engine, p, params) for p, params in requests))
    assert together == alone
    assert any(reason == FinishReason.STOP for _, _, reason in alone)
    stats = await settled(engine)
    assert stats["running"] == stats["waiting"] == stats["kv_blocks_used"] == stats["running"] == 0


def slowed(engine: AsyncEngine, seconds: float = 0.03) -> AsyncEngine:
    """Each forward pass made to last `seconds` more, asleep (no CPU taken from the other tests):
    a model whose steps are as slow as a real one's, on the tiny model."""
    runner = engine.core.runner
    real = runner.run

    def run(*args, **kwargs):
        time.sleep(seconds)
        return real(*args, **kwargs)

    runner.run = run
    return engine


async def test_requests_share_decode_steps(gpt2_model, make_engine):
    """With steps as slow as a real model's: the tiny one's are so short that its decode thread
    could run 10 of them while the 16 requests were being added (seen once in CI). Alone, they
    take 128 steps."""
    engine = slowed(make_engine(gpt2_model))
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    await collect(engine, "hello", params)
    before = engine.core.steps
    await asyncio.gather(*(collect(engine, "hello there", params) for _ in range(16)))
    assert engine.core.steps - before < 16, "16 streams of 8 tokens must share steps"


async def test_overloaded_beyond_waiting_limit_and_fair_within(gpt2_model, make_engine):
    engine = make_engine(gpt2_model, max_running=2, max_waiting=2)
    # long enough that the two running are still running when the fifth comes, on a fast CPU too
    params = SamplingParams(max_tokens=300, ignore_eos=True)
    streams = [engine.generate("hello", params) for _ in range(2)]
    while engine.stats()["running"] < 2:
        await asyncio.sleep(0.005)
    streams += [engine.generate("hello", params) for _ in range(2)]  # these two wait
    with pytest.raises(OverloadedError, match="overloaded"):
        engine.generate("hello", params)
    results = await asyncio.gather(*(_drain(s) for s in streams))
    assert all(len(ids) == 300 for ids in results)
    assert len(await _drain(engine.generate("hello", SamplingParams(max_tokens=40, ignore_eos=True)))) == 40  # room again


async def _drain(stream) -> list[int]:
    return [t async for c in stream for t in c.token_ids]


async def test_blocks_running_out_preempt_the_latest_row_which_resumes_unchanged(gpt2_model, make_engine):
    """A pool of 7 blocks (112 tokens) and three answers of 50 tokens: admission counts real
    tokens, so all three start; when blocks run out the latest row gives its blocks back, then
    recomputes its history and goes on. Every stream is whole, and as it is alone."""
    engine = make_engine(gpt2_model, max_batch_tokens=120)
    with pytest.raises(ValidationError, match="max_tokens"):
        engine.generate("hello", SamplingParams(max_tokens=200))
    requests = [(f"hello {word}", SamplingParams(max_tokens=50, ignore_eos=True)) for word in ("fox", "dog", "cat")]
    alone = [await collect(engine, p, params) for p, params in requests]
    assert engine.stats()["preemptions"] == 0
    together = await asyncio.gather(*(collect(engine, p, params) for p, params in requests))
    assert together == alone and all(len(ids) == 50 for ids, _, _ in together)
    stats = await settled(engine)
    assert stats["preemptions"] > 0 and stats["kv_blocks_used"] == 0


async def test_cancel_leaves_batch_and_frees_slot(gpt2_model, make_engine):
    engine = make_engine(gpt2_model, max_running=1)
    long = SamplingParams(max_tokens=400, ignore_eos=True)
    stream = engine.generate("hello", long)
    waiting = engine.generate("hello", SamplingParams(max_tokens=5, ignore_eos=True))
    await stream.__anext__()
    assert engine.stats()["running"] == 1 and engine.stats()["waiting"] == 1
    await stream.aclose()  # what a client disconnect does to the executor's generator
    ids = await asyncio.wait_for(_drain(waiting), 30)
    assert len(ids) == 5  # the freed slot was reused
    stats = await settled(engine)
    assert stats["running"] == stats["kv_blocks_used"] == stats["running"] == 0


async def test_cancelled_task_aborts_request(gpt2_model, make_engine):
    engine = make_engine(gpt2_model)
    task = asyncio.create_task(_drain(engine.generate("hi", SamplingParams(max_tokens=400, ignore_eos=True))))
    while engine.core.steps < 5:
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    stats = await settled(engine)
    assert stats["running"] == 0 and stats["running"] == 0 and stats["kv_blocks_used"] == 0


async def test_one_failing_request_does_not_disturb_others(gpt2_model, make_engine):
    engine = make_engine(gpt2_model)
    requests = mixed_requests(6, seed=3)
    alone = [await collect(engine, p, params) for p, params in requests]
    bad_params = SamplingParams(max_tokens=30, do_sample=True, seed=1, ignore_eos=True)
    bad = engine.generate("hello", bad_params)
    request = engine.core.scheduler._waiting[-1]

    def explode(history, logits, position):
        if len(history) > request.prompt_ids.__len__() + 3:
            raise RuntimeError("injected failure")
        return original(history, logits, position)
    original, request.chooser.choose = request.chooser.choose, explode

    async def consume_bad():
        with pytest.raises(RequestFailedError, match="injected failure"):  # that request's own failure
            await _drain(bad)
    together = await asyncio.gather(consume_bad(), *(collect(engine, p, params) for p, params in requests))
    assert list(together[1:]) == alone
    assert engine.healthy and engine.loop_restarts == 0


async def test_loop_failure_fails_everyone_then_recovers(gpt2_model, make_engine):
    engine = make_engine(gpt2_model)
    original = engine.core._run
    calls = {"n": 0}

    def broken(plan):  # once all three decode together: the engine may step before the last joins
        if len(plan.work) == 3 and all(w.count == 1 for w in plan.work):
            calls["n"] += 1
            if calls["n"] == 2:
                raise MemoryError("injected loop failure")
        return original(plan)
    engine.core._run = broken
    params = SamplingParams(max_tokens=20, ignore_eos=True)
    outcomes = await asyncio.gather(*(_drain(engine.generate("hi", params)) for _ in range(3)),
                                    return_exceptions=True)
    assert all(isinstance(o, GenerationError) and "injected loop failure" in str(o) for o in outcomes)
    assert engine.loop_restarts == 1 and engine.healthy
    assert len(await _drain(engine.generate("hi", params))) == 20
    assert (await settled(engine))["kv_blocks_used"] == 0


async def test_slow_reader_gets_coalesced_chunks_without_loss(gpt2_model, make_engine):
    engine = make_engine(gpt2_model)
    params = SamplingParams(max_tokens=60, ignore_eos=True)
    fast = await collect(engine, "hello world", params)
    chunks = []
    async for chunk in engine.generate("hello world", params):
        chunks.append(chunk)
        await asyncio.sleep(0.05)
    assert any(len(c.token_ids) > 1 for c in chunks), "a slow reader gets several tokens per chunk"
    assert [t for c in chunks for t in c.token_ids] == fast[0]
    assert "".join(c.text for c in chunks) == fast[1]
    assert chunks[-1].index == 59 and chunks[-1].finish_reason == FinishReason.LENGTH


async def test_long_prefill_is_chunked_between_decode_steps(gpt2_model, make_engine):
    engine = make_engine(gpt2_model, max_prefill_tokens=8)
    runner = engine.generate("hi", SamplingParams(max_tokens=200, ignore_eos=True))
    await runner.__anext__()
    long_prompt = " ".join(["quick brown fox"] * 40)  # well over 100 tokens: 13+ chunks of 8
    newcomer = engine.generate(long_prompt, SamplingParams(max_tokens=2, ignore_eos=True))
    runner_tokens = 0

    async def read_runner():
        nonlocal runner_tokens
        async for chunk in runner:
            runner_tokens += len(chunk.token_ids)
    reader = asyncio.create_task(read_runner())
    await _drain(newcomer)
    during = runner_tokens
    reader.cancel()
    prompt_len = len(engine.tokenizer(long_prompt)["input_ids"])
    assert during >= prompt_len // 8 - 2, "running stream must advance while a long prompt prefills"


async def test_a_long_prompt_does_not_shrink_the_batch(gpt2_model, make_engine):
    """The pool counts real tokens, not rows x the longest: beside one long request, the short
    ones all run (max_running), where a padded batch of 1,000 tokens held two rows."""
    engine = make_engine(gpt2_model, max_batch_tokens=1000, max_running=16)
    long_prompt = " ".join(["quick brown fox"] * 40)
    streams = [engine.generate(long_prompt, SamplingParams(max_tokens=100, ignore_eos=True))]
    # long enough that all sixteen run together for many steps, whenever each is admitted: with 8
    # tokens the first could end before the last came in on a loaded machine, and the watch saw 12
    streams += [engine.generate("hi", SamplingParams(max_tokens=40, ignore_eos=True)) for _ in range(15)]
    peak = 0

    async def watch():
        nonlocal peak
        while True:
            peak = max(peak, engine.stats()["running"])
            await asyncio.sleep(0.001)
    watcher = asyncio.create_task(watch())
    results = await asyncio.gather(*(_drain(s) for s in streams))
    watcher.cancel()
    assert [len(r) for r in results] == [100] + [40] * 15
    assert peak == 16 and engine.stats()["preemptions"] == 0


async def test_stream_dropped_before_reading_is_aborted(gpt2_model, make_engine):
    import gc
    engine = make_engine(gpt2_model)
    stream = engine.generate("hello", SamplingParams(max_tokens=400, ignore_eos=True))
    del stream
    gc.collect()
    stats = await settled(engine)
    assert stats["aborted"] == 1 and stats["kv_blocks_used"] == 0


async def test_stream_interval_groups_tokens_without_losing_any(gpt2_model):
    """Documents of at least N tokens (the last may be shorter); the text is the same. Slowed
    steps let the reader keep up: a reader that falls behind gets everything pending in one
    document, which is right, but would leave nothing to check here."""
    engine = slowed(AsyncEngine(EngineConfig(model=gpt2_model, stream_interval=3)))
    try:
        async def chunks(**kw):
            return [c async for c in engine.generate("hello", SamplingParams(max_tokens=10, ignore_eos=True, **kw))]
        server_default, per_request, every_token = await chunks(), await chunks(stream_interval=4), \
            await chunks(stream_interval=1)
        assert [len(c.token_ids) for c in server_default[:-1]] and all(len(c.token_ids) >= 3 for c in server_default[:-1])
        assert all(len(c.token_ids) >= 4 for c in per_request[:-1]) and len(per_request) <= 3
        texts = {"".join(c.text for c in run) for run in (server_default, per_request, every_token)}
        assert len(texts) == 1 and sum(len(c.token_ids) for c in per_request) == 10
    finally:
        engine.shutdown()
