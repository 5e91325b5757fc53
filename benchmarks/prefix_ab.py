"""python -m benchmarks.prefix_ab: what prefix caching costs where nothing is reused, engine alone.

Greedy streams of 64 tokens on the default model at C=1 and C=16, every prompt starting
differently (so no block is ever reused), with the prefix cache on and off in alternating
rounds of one run on one engine, so that a noisy machine hurts both arms alike. The cost looked
for: each block's key (a hash of its tokens and its parent's), the lookups, and keeping the
blocks' keys in the pool.
"""
import argparse
import asyncio
import itertools
import json
import statistics

from contract import EngineConfig
from engine import AsyncEngine

from .engine_bench import prompt_of
from .logprobs_bench import round_tok_s


async def main(args: argparse.Namespace) -> dict:
    engine = AsyncEngine(EngineConfig(model=args.model))
    arms = {"cache on": True, "cache off": False}
    fresh = itertools.count()
    try:
        base = [prompt_of(engine.tokenizer, 16 + i) for i in range(max(args.concurrency))]
        results: dict[str, dict[str, list[float]]] = {}
        for c in args.concurrency:
            results[f"C={c}"] = {arm: [] for arm in arms}
            for r in range(args.rounds + 1):  # the first round warms up
                for arm, caching in arms.items():
                    engine.core.kv.caching = caching  # between rounds: the engine is idle
                    prompts = [f"Note {next(fresh)}. {p}" for p in base[:c]]  # no shared first block
                    tok_s = await round_tok_s(engine, prompts, args.tokens, {})
                    if r:
                        results[f"C={c}"][arm].append(tok_s)
    finally:
        engine.shutdown()
    medians = {level: {arm: statistics.median(v) for arm, v in arms_.items()} for level, arms_ in results.items()}
    return {"model": args.model, "tokens": args.tokens, "rounds": args.rounds, "tok_s": results,
            "median_tok_s": medians, "on_over_off": {level: m["cache on"] / m["cache off"] for level, m in medians.items()},
            "blocks_cached": engine.core.kv.stats()["prefix_cache_blocks"]}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="models/SmolLM2-135M-Instruct")
    parser.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 16])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    print(json.dumps(asyncio.run(main(parser.parse_args())), indent=1))
