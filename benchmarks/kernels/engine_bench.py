"""python -m benchmarks engine: same-run micro-benchmarks of the engine.

(a) ms per token, 16-token prompt, 64 tokens, one stream, gpt2-small: the engine alone,
    the executor over gRPC (flow subprocess + client), the seed-style generate(max_new_tokens=1) loop.
(b) 16 concurrent greedy streams vs the same 16 one after another through the engine (wall clock).
(c) one batched engine step (16 running rows, decode only) vs a bare HF forward over the same
    batch with a DynamicCache growing through the same KV lengths.
(d) the gRPC executor's tok/s for one stream relative to the engine's, from (a).
"""
import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Optional

import torch

from contract import EngineConfig, SamplingParams
from engine import AsyncEngine
from testing.procs import stop_all

from .. import RESULTS
from ..harness.load import make_prompts
from ..harness.models import DEFAULT_CACHE, ensure_model
from ..harness.report import machine_info
from ..harness.systems import this_service


def prompt_of(tokenizer, n_tokens: int) -> str:
    """A corpus prompt that the model's tokenizer splits into exactly n_tokens (or just over)."""
    words = " ".join(make_prompts(8, seed=1, min_words=64, max_words=96)).split()
    for k in range(1, len(words)):
        text = " ".join(words[:k])
        if len(tokenizer(text)["input_ids"]) >= n_tokens:
            return text
    return " ".join(words)


async def timed_stream(stream) -> tuple[float, float, int]:
    """(TTFT s, total s, tokens) of an async iterator of token counts."""
    t0 = time.perf_counter()
    ttft, tokens = None, 0
    async for n in stream:
        ttft = ttft if ttft is not None else time.perf_counter() - t0
        tokens += n
    return ttft, time.perf_counter() - t0, tokens


def per_token_ms(ttft: float, total: float, tokens: int) -> float:
    """Decode ms per token after the first, as TPOT."""
    return 1000 * (total - ttft) / max(tokens - 1, 1)


async def engine_one_stream(engine: AsyncEngine, prompt: str, tokens: int, repeats: int) -> dict:
    params = SamplingParams(max_tokens=tokens, ignore_eos=True)
    async def run():
        return await timed_stream(len(c.token_ids) async for c in engine.generate(prompt, params))
    await run()  # warm-up
    results = [await run() for _ in range(repeats)]
    return {"ms_per_token": round(statistics.median(per_token_ms(*r) for r in results), 2),
            "ttft_ms": round(1000 * statistics.median(r[0] for r in results), 2),
            "tokens": results[0][2]}


async def grpc_one_stream(model: Path, prompt: str, tokens: int, repeats: int, logs: Path) -> dict:
    notes: list[str] = []
    async with this_service(model, logs, notes) as transports:
        send = transports["grpc"]
        await timed_stream(send(prompt, tokens))
        results = [await timed_stream(send(prompt, tokens)) for _ in range(repeats)]
    return {"ms_per_token": round(statistics.median(per_token_ms(*r) for r in results), 2),
            "ttft_ms": round(1000 * statistics.median(r[0] for r in results), 2),
            "tokens": min(r[2] for r in results)}


@torch.inference_mode()
def seed_loop(engine: AsyncEngine, prompt: str, tokens: int) -> dict:
    """The tutorial's loop: generate(max_new_tokens=1) over the whole sequence for every token."""
    model, tok = engine.core.loaded.model, engine.tokenizer
    ids = tok(prompt, return_tensors="pt")["input_ids"]
    model.generate(ids, max_new_tokens=1, do_sample=False, pad_token_id=tok.eos_token_id)  # warm-up
    t0 = time.perf_counter()
    for _ in range(tokens):
        ids = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=1,
                             do_sample=False, pad_token_id=tok.eos_token_id)
    return {"ms_per_token": round(1000 * (time.perf_counter() - t0) / tokens, 2), "tokens": tokens}


def record_steps(engine: AsyncEngine) -> list[tuple[float, int, bool]]:
    """Wrap engine.core.step (instance attribute): (seconds, rows, decode-only) per step."""
    core, log = engine.core, []
    inner = core.step

    def step() -> None:
        rows, quiet = len(core.scheduler.running), not core.scheduler.prefilling and not core.scheduler.num_waiting
        t0 = time.perf_counter()
        inner()
        log.append((time.perf_counter() - t0, rows, quiet))
    core.step = step
    return log


async def concurrent_vs_sequential(engine: AsyncEngine, prompt: str, tokens: int, streams: int) -> dict:
    params = SamplingParams(max_tokens=tokens, ignore_eos=True)
    async def one():
        return await timed_stream(len(c.token_ids) async for c in engine.generate(prompt, params))
    await one()  # warm-up
    t0 = time.perf_counter()
    for _ in range(streams):
        await one()
    sequential = time.perf_counter() - t0
    steps = record_steps(engine)
    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(streams)))
    concurrent = time.perf_counter() - t0
    full = [s for s, rows, quiet in steps if rows == streams and quiet]
    return {"sequential_s": round(sequential, 3), "concurrent_s": round(concurrent, 3),
            "speedup": round(sequential / concurrent, 2),
            "engine_step_ms": round(1000 * statistics.median(full), 2) if full else None,
            "engine_steps_measured": len(full)}


@torch.inference_mode()
def bare_forward(engine: AsyncEngine, prompt: str, tokens: int, batch: int) -> dict:
    """Plain HF decode over the same batch: DynamicCache, no mask, argmax fed back, per-step median."""
    from transformers import DynamicCache
    model, tok = engine.core.loaded.model, engine.tokenizer
    ids = tok([prompt] * batch, return_tensors="pt")["input_ids"].to(engine.core.loaded.device)
    times = []
    for _ in range(2):  # the first pass warms up
        cache = DynamicCache()
        out = model(input_ids=ids, past_key_values=cache, use_cache=True)
        nxt = out.logits[:, -1:].argmax(-1)
        times = []
        for _ in range(tokens - 1):
            t0 = time.perf_counter()
            out = model(input_ids=nxt, past_key_values=cache, use_cache=True)
            times.append(time.perf_counter() - t0)
            nxt = out.logits[:, -1:].argmax(-1)
    return {"bare_forward_ms": round(1000 * statistics.median(times), 2)}


async def run(args: argparse.Namespace) -> dict:
    results: dict = {"settings": {"prompt_tokens": args.prompt_tokens, "tokens": args.tokens,
                                  "streams": args.streams, "repeats": args.repeats}}
    logs = args.out / "logs"
    for name in args.models:
        path = ensure_model(name, args.models_dir)
        engine = AsyncEngine(EngineConfig(model=str(path)))
        try:
            prompt = prompt_of(engine.tokenizer, args.prompt_tokens)
            r: dict = {"prompt_tokens": len(engine.tokenizer(prompt)["input_ids"])}
            if name == args.single_model:
                print(f"[{name}] (a) one stream: engine", flush=True)
                r["engine"] = await engine_one_stream(engine, prompt, args.tokens, args.repeats)
                print(f"[{name}] (a) seed-style loop", flush=True)
                r["seed_loop"] = await asyncio.to_thread(seed_loop, engine, prompt, args.tokens)
            print(f"[{name}] (b, c) {args.streams} concurrent vs sequential", flush=True)
            r["batching"] = await concurrent_vs_sequential(engine, prompt, args.tokens, args.streams)
            r["batching"].update(await asyncio.to_thread(bare_forward, engine, prompt, args.tokens, args.streams))
        finally:
            engine.shutdown()
        if name == args.single_model:
            print(f"[{name}] (a) executor over gRPC", flush=True)
            r["executor_grpc"] = await grpc_one_stream(path, prompt, args.tokens, args.repeats, logs)
        results[name] = r
    return results


def table(results: dict, single: str) -> str:
    lines = []
    r = results.get(single, {})
    if "engine" in r:
        eng, grpc, seed = r["engine"]["ms_per_token"], r["executor_grpc"]["ms_per_token"], r["seed_loop"]["ms_per_token"]
        lines += [f"(a) {single}, {r['prompt_tokens']}-token prompt, {results['settings']['tokens']} tokens, one stream",
                  "| path | ms/token | tok/s | vs engine |", "|---|---|---|---|"]
        for label, ms in (("engine (AsyncEngine)", eng), ("executor over gRPC", grpc),
                          ("seed generate(max_new_tokens=1) loop", seed)):
            lines.append(f"| {label} | {ms} | {1000 / ms:.1f} | {ms / eng:.2f}x time |")
        lines.append(f"(d) gRPC executor tok/s / engine tok/s = {eng / grpc:.2f}")
    lines += ["", f"(b, c) {results['settings']['streams']} streams",
              "| model | sequential s | concurrent s | speedup | engine step ms | bare HF forward ms | step/forward |",
              "|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        if name == "settings" or "batching" not in r:
            continue
        b = r["batching"]
        ratio = f"{b['engine_step_ms'] / b['bare_forward_ms']:.2f}" if b["engine_step_ms"] else "n/a"
        lines.append(f"| {name} | {b['sequential_s']} | {b['concurrent_s']} | {b['speedup']}x | "
                     f"{b['engine_step_ms']} | {b['bare_forward_ms']} | {ratio} |")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks engine", description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--models", type=lambda s: s.split(","), default=["tiny", "gpt2-small"],
                   help="models for (b, c)")
    p.add_argument("--single-model", default="gpt2-small", help="model for (a) and (d)")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--prompt-tokens", type=int, default=16)
    p.add_argument("--streams", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--models-dir", type=Path, default=DEFAULT_CACHE)
    args = p.parse_args(argv)
    if args.single_model not in args.models:
        args.models.append(args.single_model)
    try:
        results = asyncio.run(run(args))
    finally:
        stop_all()
    results["machine"] = machine_info()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "engine_bench.json").write_text(json.dumps(results, indent=1))
    print(table(results, args.single_model))
    print(f"\nwrote {args.out / 'engine_bench.json'}")

