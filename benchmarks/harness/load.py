"""Prompts and load generators: closed loop at fixed concurrency, open loop with Poisson arrivals.

A transport is `send(prompt, max_tokens)`: an async iterator of the token count of
each streamed document. Every level stops issuing requests after `time_limit`
seconds and abandons (cancels) requests still running after twice that.
"""
import asyncio
import random
import time
from collections.abc import AsyncIterator, Callable
from typing import Optional

from testing.toy_models import corpus

from .metrics import RequestRecord

Transport = Callable[[str, int], AsyncIterator[int]]


def make_prompts(n: int, seed: int = 0, min_words: int = 4, max_words: int = 96, draw: str = "") -> list[str]:
    """Deterministic prompts of mixed length (uniform word counts), from the toy models' corpus.
    Each `draw` (a load level, the warm-up) gets prompts of its own: a server with a prompt
    cache (llama.cpp's is on by default) would otherwise skip the prefill of prompts it saw
    in an earlier level, which real traffic does not repeat."""
    rng = random.Random(f"{seed}/{draw}" if draw else seed)
    words = " ".join(corpus(400, seed)).split()
    prompts = []
    for _ in range(n):
        k = rng.randint(min_words, max_words)
        start = rng.randrange(len(words) - k)
        prompts.append(" ".join(words[start:start + k]))
    return prompts


async def run_request(send: Transport, prompt: str, max_tokens: int,
                      records: list[RequestRecord]) -> None:
    record = RequestRecord(prompt_chars=len(prompt))
    records.append(record)
    try:
        async for n_tokens in send(prompt, max_tokens):
            record.on_document(n_tokens)
    except asyncio.CancelledError:
        record.finish("cancelled at the level's time limit")
        raise
    except Exception as exc:  # noqa: BLE001 - a failed request is a data point, not a crash
        record.finish(f"{type(exc).__name__}: {exc}"[:300])
    else:
        record.finish(None if record.arrivals else "empty stream")


async def _bounded(tasks: list[asyncio.Task], records: list[RequestRecord], t0: float,
                   hard_limit: float) -> tuple[list[RequestRecord], float, bool]:
    done, pending = await asyncio.wait(tasks, timeout=max(0.0, t0 + hard_limit - time.perf_counter()))
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    ends = [r.end for r in records if r.end is not None]
    duration = (max(ends) if ends else time.perf_counter()) - t0
    return records, duration, bool(pending)


async def closed_loop(send: Transport, prompts: list[str], concurrency: int, n: int,
                      max_tokens: int, time_limit: float) -> tuple[list[RequestRecord], float, bool]:
    """C workers; each sends its next request when its previous one ends; n requests in all.
    Returns (records, duration in seconds, whether the level was cut short)."""
    records: list[RequestRecord] = []
    issued = 0
    t0 = time.perf_counter()

    async def worker() -> None:
        nonlocal issued
        while issued < n and time.perf_counter() - t0 < time_limit:
            i, issued = issued, issued + 1
            await run_request(send, prompts[i % len(prompts)], max_tokens, records)

    tasks = [asyncio.create_task(worker()) for _ in range(concurrency)]
    records, duration, cut = await _bounded(tasks, records, t0, 2 * time_limit)
    return records, duration, cut or len(records) < n


async def poisson(send: Transport, prompts: list[str], rate: float, n: int, max_tokens: int,
                  time_limit: float, seed: int = 0) -> tuple[list[RequestRecord], float, bool]:
    """Open loop: n requests with exponential inter-arrival gaps of mean 1/rate, never waiting
    for answers (as vLLM's --request-rate)."""
    rng = random.Random(seed)
    records: list[RequestRecord] = []
    tasks: list[asyncio.Task] = []
    t0 = time.perf_counter()
    next_at = 0.0
    for i in range(n):
        delay = t0 + next_at - time.perf_counter()
        if next_at > time_limit:
            break
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(run_request(send, prompts[i % len(prompts)], max_tokens, records)))
        next_at += rng.expovariate(rate)
    records, duration, cut = await _bounded(tasks, records, t0, 2 * time_limit)
    return records, duration, cut or len(records) < n


def default_requests(concurrency: int, quick: bool, override: Optional[int] = None) -> int:
    """N per closed-loop level: max(2C, 8) in quick mode, max(4C, 16) otherwise."""
    if override:
        return override
    return max(2 * concurrency, 8) if quick else max(4 * concurrency, 16)
