"""The decode loop in its own process (EngineProcess): the same tokens as the thread, the
same refusals (they cross the pipe with their field), aborts that free the slot, and no
process left behind or hanging when either side dies."""
import asyncio
import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
import torch
from transformers import AutoModelForCausalLM

from contract import EngineConfig, GenerationError, OverloadedError, SamplingParams, ValidationError
from engine import AsyncEngine, EngineProcess
from engine.core.core_process import serving_threads
from engine.model.loader import load_model
from tests.conftest import ROOT

LIMITS = {"max_running": 4, "max_waiting": 8, "max_batch_tokens": 500}
GREEDY = SamplingParams(max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def engines(gpt2_model):
    """(the engine process, the thread engine) on one model with the same limits."""
    process = EngineProcess(EngineConfig(model=gpt2_model, **LIMITS))
    thread = AsyncEngine(EngineConfig(model=gpt2_model, **LIMITS))
    yield process, thread
    process.shutdown()
    thread.shutdown()
    assert process._process.poll() is not None


async def _text(engine, prompt: str, params: SamplingParams) -> tuple[str, list[int]]:
    chunks = [c async for c in await engine.open(prompt, params)]
    return "".join(c.text for c in chunks), [t for c in chunks for t in c.token_ids]


async def _wait_idle(engine, timeout: float = 10.0) -> dict:
    for _ in range(int(timeout / 0.05)):
        stats = engine.stats()
        if stats["running"] == stats["prefilling"] == stats["waiting"] == stats["kv_blocks_used"] == 0:
            return stats
        await asyncio.sleep(0.05)
    raise AssertionError(f"slots still held: {engine.stats()}")


async def test_same_tokens_as_the_thread_batched_or_alone(engines):
    process, thread = engines
    requests = [("hello world", GREEDY), ("the quick brown fox", GREEDY),
                ("once upon", SamplingParams(max_tokens=24, do_sample=True, seed=2**64 - 1, ignore_eos=True)),
                ("a b c", SamplingParams(max_tokens=24, do_sample=True, top_k=5, seed=7, ignore_eos=True))] * 2
    alone = [await _text(thread, p, params) for p, params in requests]
    together = await asyncio.gather(*(_text(process, p, params) for p, params in requests))
    assert together == alone  # 8 requests, 4 rows: some wait, then join the running batch
    await _wait_idle(process)


async def test_a_loop_that_fell_behind_takes_the_steps_it_missed_in_one_chunk(engines):
    """Steps that piled up in the pipe while the loop was busy reach each stream together,
    as one chunk, not one chunk per loop turn: serving falls behind less under load."""
    process, _ = engines
    params = SamplingParams(max_tokens=60, ignore_eos=True)
    streams = [await process.open(prompt, params) for prompt in ("hello world", "the quick brown fox")]
    first = [len((await s.__anext__()).token_ids) for s in streams]
    time.sleep(0.5)  # the loop is busy: the engine's next steps wait in the pipe
    await asyncio.sleep(0)  # one loop turn reads them
    behind = [len((await s.__anext__()).token_ids) for s in streams]
    assert all(n >= 10 for n in behind), behind
    assert [a + b + await _drain(s) for a, b, s in zip(first, behind, streams, strict=True)] == [60, 60]  # none twice
    await _wait_idle(process)


async def test_refusals_cross_the_pipe_before_any_token(engines):
    process, _ = engines
    with pytest.raises(ValidationError) as err:  # the batch budget is checked in the engine process
        await process.open("hello", SamplingParams(max_tokens=505))
    assert err.value.field == "max_tokens" and "KV cache" in str(err.value)
    long = SamplingParams(max_tokens=100, ignore_eos=True)
    opened = await asyncio.gather(*(process.open("hi", long) for _ in range(14)), return_exceptions=True)
    refused = [o for o in opened if isinstance(o, BaseException)]
    assert refused and all(isinstance(o, OverloadedError) for o in refused), refused
    served = await asyncio.gather(*(_drain(o) for o in opened if not isinstance(o, BaseException)))
    assert len(served) >= LIMITS["max_waiting"] and all(n == 100 for n in served)
    await _wait_idle(process)
    assert (await _text(process, "hello world", GREEDY))[1]  # room again


async def _drain(stream) -> int:
    return sum([len(c.token_ids) async for c in stream])


async def test_abort_frees_the_slot_within_steps(slow_model):
    process = EngineProcess(EngineConfig(model=slow_model))  # tens of ms per token: surely still running
    try:
        stream = await process.open("hi", SamplingParams(max_tokens=300, ignore_eos=True))
        await stream.__anext__()
        await stream.aclose()
        stats = await _wait_idle(process)
        assert stats["aborted"] == 1 and stats["steps"] < 100, stats
    finally:
        process.shutdown()


async def test_stream_interval_ms_coalesces_by_time(slow_model):
    """The slow model: a reader that fell behind would take the second token with the first."""
    engine = AsyncEngine(EngineConfig(model=slow_model, stream_interval_ms=60_000 - 1))
    try:
        chunks = [c async for c in engine.generate("hello", SamplingParams(max_tokens=30, ignore_eos=True))]
    finally:
        engine.shutdown()
    # The first chunk at once, then nothing until the end; a reader the machine kept waiting past
    # the second token takes it with the first, which moves the split but not the count.
    sizes = [len(c.token_ids) for c in chunks]
    assert len(sizes) == 2 and sum(sizes) == 30 and sizes[0] < sizes[1], sizes
    assert chunks[-1].finish_reason == "length"


async def _answer_then_a_long_stream(engine):
    """(a greedy answer to replay later, a long stream that has begun)."""
    expected = await _text(engine, "hello world", GREEDY)
    stream = await engine.open("hi", SamplingParams(max_tokens=400, ignore_eos=True))
    await stream.__anext__()
    return expected, stream


async def _fails_then_replaced(engine, stream) -> None:
    """The stream ends with the process's error, and a new process takes requests within a minute."""
    with pytest.raises(GenerationError, match="engine process exited"):
        async for _ in stream:
            pass
    for _ in range(600):
        if engine.healthy:
            break
        await asyncio.sleep(0.1)


async def test_a_killed_engine_process_fails_its_requests_and_is_replaced(gpt2_model):
    engine = EngineProcess(EngineConfig(model=gpt2_model))
    try:
        expected, stream = await _answer_then_a_long_stream(engine)
        os.kill(engine.pid, signal.SIGKILL)
        await _fails_then_replaced(engine, stream)
        assert engine.stats()["process_restarts"] == 1
        assert await _text(engine, "hello world", GREEDY) == expected
    finally:
        engine.shutdown()


async def test_a_stalled_engine_process_is_replaced_and_its_numbers_say_their_age(gpt2_model, monkeypatch, caplog):
    """A process that stops answering with requests in flight (stopped here; a hang, a blocked
    pipe) is a stall: /stats says how old its frozen numbers are, and after LLM_ENGINE_STALL_S the
    watchdog has it dump its stacks and replaces it; its requests end with an error, not never."""
    from engine.frontend import engine_process
    monkeypatch.setattr(engine_process, "STALL_S", 2.0)
    engine = EngineProcess(EngineConfig(model=gpt2_model))
    try:
        expected, stream = await _answer_then_a_long_stream(engine)
        os.kill(engine.pid, signal.SIGSTOP)
        await asyncio.sleep(1.0)
        frozen = engine.stats()
        assert frozen["running"] == 1 and frozen["stats_age_s"] >= 0.9 and frozen["stalls"] == 0
        await _fails_then_replaced(engine, stream)
        assert (engine.stats()["stalls"], engine.stats()["process_restarts"]) == (1, 1)
        assert "a stall" in caplog.text
        assert await _text(engine, "hello world", GREEDY) == expected
        assert engine.stats()["stats_age_s"] < 1.0
    finally:
        engine.shutdown()


def test_each_loop_in_turn_reads_the_pipe_and_an_idle_death_is_replaced(gpt2_model):
    """The outputs are read on the event loop of the requests; when that loop closes, the
    next request's loop takes over. A process that dies with nothing in flight is replaced
    all the same, and the new pipe is read too."""
    engine = EngineProcess(EngineConfig(model=gpt2_model))
    try:
        first = asyncio.run(_text(engine, "hello world", GREEDY))  # a loop of its own, then closed
        assert asyncio.run(_text(engine, "hello world", GREEDY)) == first  # another loop reads
        os.kill(engine.pid, signal.SIGKILL)  # idle: no request sees it die
        deadline = time.monotonic() + 60
        while not (engine.healthy and engine.process_restarts == 1) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert engine.healthy and engine.process_restarts == 1
        assert asyncio.run(_text(engine, "hello world", GREEDY)) == first
    finally:
        engine.shutdown()


def test_the_engine_process_exits_when_its_parent_is_killed(gpt2_model):
    script = textwrap.dedent(f"""
        import sys, time
        from contract import EngineConfig
        from engine import EngineProcess
        engine = EngineProcess(EngineConfig(model={gpt2_model!r}))
        print(engine.pid, flush=True)
        time.sleep(600)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        child = psutil.Process(int(parent.stdout.readline()))
        assert child.ppid() == parent.pid
        parent.send_signal(signal.SIGKILL)
        child.wait(timeout=15)  # raises TimeoutExpired if it is left behind
    finally:
        parent.kill()
        parent.wait()


def test_a_small_model_leaves_a_core_to_serving(gpt2_model):
    small = load_model(EngineConfig(model=gpt2_model, device="cpu"))
    assert serving_threads(EngineConfig(model="m"), small) == max(1, len(os.sched_getaffinity(0)) - 1)
    assert serving_threads(EngineConfig(model="m", torch_threads=3), small) is None  # as configured
    large = dataclasses.replace(small, parameters=64_000_000)
    assert serving_threads(EngineConfig(model="m"), large) is None  # torch's default: every core
    on_gpu = dataclasses.replace(small, device=torch.device("cuda", 0))
    assert serving_threads(EngineConfig(model="m"), on_gpu) is None  # the CPU only launches its kernels


def test_the_size_that_picks_threads_counts_int4_weights(llama_model):
    """int4, and fp32's layers in the C kernel, move a model's weights from parameters to buffers:
    the default model once counted as small that way, and its engine ran one torch thread instead
    of two. The loader counts them before."""
    fp32 = load_model(EngineConfig(model=llama_model, device="cpu", dtype="fp32"))
    int4 = load_model(EngineConfig(model=llama_model, device="cpu", dtype="int4"))
    assert int4.info.dtype == "int4"
    assert sum(p.numel() for p in int4.model.parameters()) < int4.parameters  # what it counted
    published = AutoModelForCausalLM.from_pretrained(llama_model).num_parameters()
    assert int4.parameters == fp32.parameters == published


async def test_the_first_request_after_an_idle_spell_is_not_a_stall(gpt2_model, monkeypatch):
    """An idle process sends nothing; the watchdog counts a request's wait from when it arrived,
    not from the process's last message. Here the process is paused through an idle spell longer
    than LLM_ENGINE_STALL_S, a request arrives, and the process resumes within the limit."""
    from engine.frontend import engine_process
    monkeypatch.setattr(engine_process, "STALL_S", 2.0)
    engine = EngineProcess(EngineConfig(model=gpt2_model))
    try:
        expected = await _text(engine, "hello world", GREEDY)
        os.kill(engine.pid, signal.SIGSTOP)
        await asyncio.sleep(2.5)  # idle, and silent, past the limit
        answer = asyncio.create_task(_text(engine, "hello world", GREEDY))
        await asyncio.sleep(1.0)  # the request has waited half the limit
        assert engine.silence() < 1.5 and engine.stats()["stalls"] == 0
        os.kill(engine.pid, signal.SIGCONT)
        assert await answer == expected
        assert (engine.stats()["stalls"], engine.stats()["process_restarts"]) == (0, 0)
    finally:
        engine.shutdown()


async def test_an_engine_process_started_ahead_serves_the_executor_that_claims_it(gpt2_model, engines, monkeypatch):
    """As `make serve`'s launcher starts it (engine/core/ahead_process.py): claimed, it loads the
    config it is sent, answers the same tokens, and exits when shut down, though it is not this
    process's child; the next claim finds none and the executor starts its own."""
    from engine import SpareCore
    from engine.frontend import ahead
    monkeypatch.setenv(ahead.AHEAD, "")  # unset, as blank is; restored after the name start_ahead sets
    launched = ahead.start_ahead()
    assert launched is not None
    core = None
    for _ in range(100):  # it listens within its first tenth of a second
        if (core := ahead.claim_ahead()) is not None:
            break
        time.sleep(0.05)
    assert core is not None and core.process.pid == launched.pid and ahead.claim_ahead() is None
    claimed = EngineProcess(EngineConfig(model=gpt2_model, **LIMITS), spare=SpareCore(core))
    try:
        assert claimed.pid == launched.pid and claimed.start_stages["spare"] == 1.0
        assert await _text(claimed, "hello world", GREEDY) == await _text(engines[1], "hello world", GREEDY)
    finally:
        claimed.shutdown()
    assert launched.wait(10) == 0
