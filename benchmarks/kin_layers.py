"""python -m benchmarks.kin_layers: Llama's kin (Mistral, Phi-3, Qwen2, Qwen3) and Gemma (2, 3) with
whole decoder layers in C (llama_layer.c), against transformers' modules around the same C
products and paged attention (what those models ran before), side by side in one run.

Each model is random, of a small model's shape (12 layers, 768 wide), its projections snapped to
4-bit groups so that they run as Q4_1 int4 layers, as a Q4_0 or Q4_1 GGUF's do; or a GGUF file
named in `--models` (Gemma 3 270M's Q4_K_M: Q4_K, Q5_0, Q6_K and Q8_0 projections). One stream,
greedy, a 16-token prompt and 64 tokens (`ignore_eos`), in the engine alone: decode tokens per
second. The two arms alternate, `--repeats` rounds; the median of each is reported. The answers of
the two arms are checked equal (the numbers are the same bit for bit, tests/unit/test_architectures.py).
"""
import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from unittest import mock

from contract import EngineConfig, SamplingParams
from engine import AsyncEngine
from engine.model import fast_layers, loader
from testing.toy_models import build

from .report import machine_info

HERE = Path(__file__).resolve().parent
KIN = ("mistral", "phi3", "qwen2", "qwen3", "gemma2", "gemma3_text")
PROMPT = "the quick brown fox jumps over the lazy dog while the cat sleeps"
WHOLE, MODULES = "whole C layers", "transformers' modules"


async def one_stream(engine: AsyncEngine, tokens: int) -> tuple[float, list[int]]:
    """Decode tokens per second of one greedy stream (from its first token on), and its tokens."""
    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    ids: list[int] = []
    first = 0.0
    async for out in engine.generate(PROMPT, params):
        if not ids:
            first = time.perf_counter()
        ids += out.token_ids
    return (len(ids) - 1) / (time.perf_counter() - first), ids


def engines(path: Path) -> dict[str, AsyncEngine]:
    """The two arms: whole C layers, and transformers' modules (with the C norms and SiLU)."""
    whole = AsyncEngine(EngineConfig(model=str(path), device="cpu"))
    with mock.patch.object(loader, "lean_layers", fast_layers.native_ops):
        modules = AsyncEngine(EngineConfig(model=str(path), device="cpu"))
    return {WHOLE: whole, MODULES: modules}


async def measure(style: str, folder: Path, repeats: int, tokens: int) -> dict:
    path = Path(style) if style.endswith(".gguf") else build(folder / style, style, size="slow", four_bit=True)
    arms = engines(path)
    try:
        rates: dict[str, list[float]] = {name: [] for name in arms}
        answers = {}
        for _ in range(repeats):
            for name, engine in arms.items():
                rate, answers[name] = await one_stream(engine, tokens)
                rates[name].append(rate)
        medians = {name: statistics.median(r) for name, r in rates.items()}
        return {"model": Path(style).name, "tok_s": medians, "ratio": medians[WHOLE] / medians[MODULES],
                "same_answers": len({tuple(a) for a in answers.values()}) == 1, "rounds": rates}
    finally:
        for engine in arms.values():
            engine.shutdown()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", type=lambda s: s.split(","), default=list(KIN))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--folder", type=Path, default=HERE / ".kin-models")
    p.add_argument("--out", type=Path, default=HERE / "results")
    args = p.parse_args(argv)
    rows = [asyncio.run(measure(style, args.folder, args.repeats, args.tokens)) for style in args.models]
    print("| model | whole C layers, tok/s | transformers' modules, tok/s | ratio | same answers |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['model']} | {r['tok_s'][WHOLE]:.1f} | {r['tok_s'][MODULES]:.1f} | {r['ratio']:.2f}x"
              f" | {'yes' if r['same_answers'] else 'NO'} |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "kin_layers.json").write_text(json.dumps({"machine": machine_info(), "rows": rows}, indent=1))
    return 0 if all(r["same_answers"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
