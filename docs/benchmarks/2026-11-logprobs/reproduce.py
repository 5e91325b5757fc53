"""What reporting top_logprobs costs, engine alone: how this record was made.

    python -m benchmarks reproduce docs/benchmarks/2026-11-logprobs [--rounds 5]

16 concurrent greedy streams of 64 tokens on the default model, without log probabilities'
alternatives and with top_logprobs=5 (and each token's text), in alternating rounds of one run,
so that a noisy machine hurts both arms alike. Prints tok/s per arm and the ratio. The record ran
this script as `python -m benchmarks.logprobs_bench --rounds 5` at 53b5344; since then each arm is
warmed up with a full round before the measured ones.
"""
import argparse
import asyncio
import json
import statistics
import time

from benchmarks.kernels.engine_bench import prompt_of
from contract import EngineConfig, SamplingParams
from engine import AsyncEngine

ARMS = {"plain": {}, "top_logprobs=5": {"logprobs": True, "top_logprobs": 5}}


async def round_tok_s(engine: AsyncEngine, prompts: list[str], tokens: int, extra: dict) -> float:
    async def one(prompt: str) -> int:
        params = SamplingParams(max_tokens=tokens, ignore_eos=True, **extra)
        return sum([len(c.token_ids) async for c in engine.generate(prompt, params)])
    t0 = time.perf_counter()
    counts = await asyncio.gather(*(one(p) for p in prompts))
    return sum(counts) / (time.perf_counter() - t0)


async def main(args: argparse.Namespace) -> dict:
    engine = AsyncEngine(EngineConfig(model=args.model))
    try:
        prompts = [prompt_of(engine.tokenizer, 16 + i) for i in range(args.concurrency)]
        for extra in ARMS.values():  # warm-up: the first full rounds allocate and settle
            await round_tok_s(engine, prompts, args.tokens, extra)
        results: dict[str, list[float]] = {arm: [] for arm in ARMS}
        for _ in range(args.rounds):
            for arm, extra in ARMS.items():
                results[arm].append(await round_tok_s(engine, prompts, args.tokens, extra))
    finally:
        engine.shutdown()
    medians = {arm: statistics.median(v) for arm, v in results.items()}
    return {"model": args.model, "concurrency": args.concurrency, "tokens": args.tokens, "rounds": args.rounds,
            "tok_s": results, "median_tok_s": medians,
            "ratio": medians["top_logprobs=5"] / medians["plain"]}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="models/SmolLM2-135M-Instruct")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    print(json.dumps(asyncio.run(main(parser.parse_args())), indent=1))
