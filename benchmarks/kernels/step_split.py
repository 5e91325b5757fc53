"""python -m benchmarks steps [--model FILE] [--out DIR]: where the engine's time goes under the
sizes record's batched loads, pass by pass, against the multiply bound.

The engine alone (in this process) on a GGUF model runs two of `python -m benchmarks sizes`'s
loads with its prompts: sixteen streams (32 requests of 64 tokens in a closed loop) and one cold
prompt of about 1,600 tokens. Every forward pass is timed with what it held: prompt tokens
(prefill chunks) or only decoding rows. Each kind of pass is then given as time, tokens a second
and billions of quantized products a second (each position's layer products, and the output
layer's for each position that samples), against the multiply bound of `benchmarks products`.

Why: sixteen streams' tokens a second counts generated tokens only, but about half of the run's
time is spent on the requests' prompts; this says how much, and how far each kind of pass is from
what the CPU's integer products allow. The model: the sized 1.17B Q4_K_M by default.
"""
import asyncio
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional

import torch

from contract import EngineConfig, SamplingParams
from engine import AsyncEngine

from .. import RESULTS
from ..harness import sized_models
from ..harness.load import closed_loop, make_prompts
from ..harness.report import machine_info, write_results
from ..records.cpu_record import cold_prompt
from ..records.sizes import COLD_PARAGRAPHS
from .multiply_rate import measure as multiply_rates
from .products_rate import kinds, our_form

SIXTEEN, REQUESTS, TOKENS = 16, 32, 64  # the sizes record's sixteen-stream level


@dataclass
class Pass:
    """One forward pass: its seconds, the prompt tokens it held, its decoding rows, the positions
    whose logits it computed."""

    seconds: float
    prompt_tokens: int
    decode_rows: int
    sampled: int


def record_passes(engine: AsyncEngine) -> list[Pass]:
    """Wrap the engine core's forward pass (an instance attribute) to time each one."""
    core, passes = engine.core, []
    inner = core._run

    def run(plan: Any) -> Any:
        started = time.perf_counter()
        result = inner(plan)
        counts = [w.count for w in plan.work]
        passes.append(Pass(time.perf_counter() - started, sum(c for c in counts if c > 1),
                           sum(1 for c in counts if c == 1), sum(1 for w in plan.work if w.samples)))
        return result
    core._run = run
    return passes


def products_a_position(model: torch.nn.Module) -> tuple[int, int]:
    """(the quantized layers' products for one position, the output layer's)."""
    output = model.get_output_embeddings()
    every = [layer for layers in kinds(model).values() for layer in layers]
    out = output.in_features * output.out_features if output in every else 0
    return sum(layer.in_features * layer.out_features for layer in every) - out, out


def split(passes: list[Pass], layers: int, output: int, bound: float) -> dict[str, Any]:
    """The passes that held prompt tokens and the decoding-only ones: seconds, tokens a second,
    billions of products a second and their fraction of `bound` (also in billions a second)."""
    result: dict[str, Any] = {}
    for name, chosen in (("with prompt tokens", [p for p in passes if p.prompt_tokens]),
                         ("decoding only", [p for p in passes if not p.prompt_tokens])):
        if not chosen:
            continue
        seconds = sum(p.seconds for p in chosen)
        positions = sum(p.prompt_tokens + p.decode_rows for p in chosen)
        products = positions * layers + sum(p.sampled for p in chosen) * output
        rate = products / seconds / 1e9
        entry = {"passes": len(chosen), "seconds": round(seconds, 2), "prompt_tokens": sum(p.prompt_tokens for p in chosen),
                 "positions_s": round(positions / seconds, 1), "g_products_s": round(rate, 1),
                 "of_bound": round(rate / bound, 3)}
        rows = [p.seconds for p in chosen if p.decode_rows == SIXTEEN and not p.prompt_tokens]
        if rows:
            entry["median_ms_at_16_rows"] = round(1000 * statistics.median(rows), 1)
        result[name] = entry
    return result


async def stream(engine: AsyncEngine, prompt: str, max_tokens: int):
    async for output in engine.generate(prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True)):
        yield len(output.token_ids)


async def loads(engine: AsyncEngine, passes: list[Pass], seed: int) -> dict[str, Any]:
    """The warm-up, then the two loads, each with the passes it made."""
    def send(prompt: str, max_tokens: int):
        return stream(engine, prompt, max_tokens)
    await closed_loop(send, make_prompts(8, seed, draw="steps warm-up"), 1, 8, TOKENS, 600)
    passes.clear()
    records, seconds, _ = await closed_loop(send, make_prompts(256, seed, draw=f"closed {SIXTEEN}"), SIXTEEN,
                                            REQUESTS, TOKENS, 900)
    sixteen = {"tok_s": round(sum(r.tokens for r in records) / seconds, 1), "seconds": round(seconds, 2),
               "passes": [asdict(p) for p in passes]}
    passes.clear()
    prompt = cold_prompt(0, COLD_PARAGRAPHS)
    started = time.perf_counter()
    await closed_loop(send, [prompt], 1, 1, 1, 900)
    tokens = len(engine.tokenizer(prompt)["input_ids"])
    cold = {"prompt_tokens": tokens, "tok_s": round(tokens / (time.perf_counter() - started), 1),
            "passes": [asdict(p) for p in passes]}
    return {"sixteen": sixteen, "cold": cold}


def measure(model_file: Path, seed: int = 0) -> dict[str, Any]:
    engine = AsyncEngine(EngineConfig(model=str(model_file)))
    try:
        passes = record_passes(engine)
        layers, output = products_a_position(engine.core.loaded.model)
        form, per_core = our_form(multiply_rates())
        bound = per_core * torch.get_num_threads()  # billions a second
        result: dict[str, Any] = {"model": model_file.name, "threads": torch.get_num_threads(), "form": form,
                                  "bound_g_s": round(bound, 1), "layer_products": layers, "output_products": output}
        for name, load in asyncio.run(loads(engine, passes, seed)).items():
            timed = [Pass(**p) for p in load["passes"]]
            result[name] = {**load, "split": split(timed, layers, output, bound)}
        return result
    finally:
        engine.shutdown()


def table(result: dict[str, Any], command: str, git: Optional[str]) -> str:
    sixteen, cold = result["sixteen"], result["cold"]
    lines = [f"# Where {result['model']}'s time goes, pass by pass", "",
             f"{time.strftime('%Y-%m-%d')}, git {git}, `{command}`; the engine alone, {result['threads']} threads. "
             f"Multiply bound: {result['bound_g_s']} billion products a second ({result['form']}). Sixteen streams: "
             f"{sixteen['tok_s']} generated tokens a second over {sixteen['seconds']} s; the cold prompt: "
             f"{cold['prompt_tokens']} tokens at {cold['tok_s']} a second.", "",
             "| load | passes | count | seconds | prompt tokens | positions a second | billion products a second "
             "| of the bound | median ms, 16 decoding rows |", "|---|---|---|---|---|---|---|---|---|"]
    for load in ("sixteen", "cold"):
        for kind, e in result[load]["split"].items():
            lines.append(f"| {load} | {kind} | {e['passes']} | {e['seconds']} | {e['prompt_tokens']} | {e['positions_s']} "
                         f"| {e['g_products_s']} | {e['of_bound']:.0%} | {e.get('median_ms_at_16_rows', '')} |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    p = sized_models.model_parser("python -m benchmarks steps", __doc__ or "", RESULTS / "steps")
    p.add_argument("--seed", type=int, default=0, help="the prompts' seed (the sizes record's default)")
    args = p.parse_args(argv)
    result = measure(sized_models.model_file(args.model), args.seed)
    command = ("python -m benchmarks steps " + " ".join(argv or [])).strip()
    text = table(result, command, machine_info().get("git"))
    write_results(args.out, text, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
