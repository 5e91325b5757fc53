"""python -m benchmarks cuda-graphs: the engine alone on a GPU, decode steps replayed from CUDA
graphs against eager steps, side by side in one process.

Each arm's engine is loaded once per model (the service's defaults, `cuda_graphs` on and off, and
with `--arms eager,graphs,graphs-no-spec` graphs without speculation too: whether one greedy
stream, which speculates by default, gains by it with graphs), then measured in alternating
rounds: at each concurrency, that many greedy streams of `--tokens` tokens each, started
together, over the benchmark's prompts. A warm-up round captures the graphs first, as a served
engine does with its first requests. Reports output tokens per second
(all streams' tokens over the wall clock), the median of the rounds, its ratio to the first arm's,
and whether each stream's tokens were the first arm's.
"""
import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

import torch

from contract import EngineConfig, SamplingParams
from engine import AsyncEngine

from ..harness.load import make_prompts
from ..harness.models import DEFAULT_CACHE, MODELS, ensure_model
from ..harness.report import machine_info

PROG = "python -m benchmarks cuda-graphs"


async def level(engine: AsyncEngine, prompts: list[str], tokens: int) -> tuple[float, list[list[int]]]:
    """(output tok/s, each stream's tokens) of len(prompts) streams started together."""
    params = SamplingParams(max_tokens=tokens, ignore_eos=True)

    async def one(prompt: str) -> list[int]:
        return [t async for chunk in engine.generate(prompt, params) for t in chunk.token_ids]
    started = time.perf_counter()
    answers = await asyncio.gather(*(one(p) for p in prompts))
    return sum(map(len, answers)) / (time.perf_counter() - started), answers


ARMS = {"eager": {"cuda_graphs": False}, "graphs": {},
        "graphs-no-spec": {"speculative_tokens": 0}}  # EngineConfig options over the service's defaults


async def compare(model: Path, arm_names: list[str], concurrency: list[int], tokens: int, rounds: int) -> dict:
    arms = {arm: AsyncEngine(EngineConfig(model=str(model), **ARMS[arm])) for arm in arm_names}
    prompts = make_prompts(max(concurrency), seed=0)
    try:
        answers: dict[str, dict[int, list]] = {arm: {} for arm in arms}
        for arm, engine in arms.items():  # warm-up: graphs captured, kernels chosen
            for c in concurrency:
                answers[arm][c] = (await level(engine, prompts[:c], tokens))[1]
        rates: dict[str, dict[int, list[float]]] = {arm: {c: [] for c in concurrency} for arm in arms}
        for r in range(rounds):
            for arm in (arm_names if r % 2 == 0 else arm_names[::-1]):
                for c in concurrency:
                    rates[arm][c].append((await level(arms[arm], prompts[:c], tokens))[0])
        graphs = arms["graphs"].core.runner.graphs if "graphs" in arms else None
        medians = {c: {arm: statistics.median(rates[arm][c]) for arm in arms} for c in concurrency}
        first = arm_names[0]
        return {"levels": [{"concurrency": c, "tok_s": {arm: round(m, 1) for arm, m in medians[c].items()},
                            f"vs_{first}": {arm: round(m / medians[c][first], 2) for arm, m in medians[c].items()},
                            f"same_tokens_as_{first}": {arm: answers[arm][c] == answers[first][c] for arm in arms},
                            "rounds": {arm: [round(x, 1) for x in rates[arm][c]] for arm in arms}}
                           for c in concurrency],
                "graphs_captured": len(graphs.captured) if graphs else 0,
                "graph_failure": graphs.failed if graphs else "no graphs in this run or on this device"}
    finally:
        for engine in arms.values():
            engine.shutdown()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--models", default="gpt2-small,llama-1b", help=f"of {','.join(MODELS)}")
    p.add_argument("--arms", default="eager,graphs", help=f"of {','.join(ARMS)}; ratios are to the first")
    p.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 16, 64])
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path, default=None, help="also write results.json here")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit(f"{PROG} needs a CUDA GPU")
    results = {"machine": machine_info(), "command": f"{PROG} " + " ".join(
        f"--{k.replace('_', '-')} {','.join(map(str, v)) if isinstance(v, list) else v}"
        for k, v in vars(args).items() if k != "out"), "models": {}}
    for name in args.models.split(","):
        arms = args.arms.split(",")
        unknown = [arm for arm in arms if arm not in ARMS]
        if unknown:
            raise SystemExit(f"unknown arms {unknown}; choose from {', '.join(ARMS)}")
        results["models"][name] = run = asyncio.run(compare(ensure_model(name, DEFAULT_CACHE), arms,
                                                            args.concurrency, args.tokens, args.rounds))
        print(f"{name}: {run['graphs_captured']} graphs captured; failure: {run['graph_failure']}", flush=True)
        for row in run["levels"]:
            cells = "  ".join(f"{arm} {row['tok_s'][arm]:>8} tok/s x{row[f'vs_{arms[0]}'][arm]}"
                              f"{'' if row[f'same_tokens_as_{arms[0]}'][arm] else ' (other tokens)'}" for arm in arms)
            print(f"  C={row['concurrency']:>3}  {cells}", flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(results, indent=2))
    return 0
