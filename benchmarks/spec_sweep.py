"""python -m benchmarks --speculation-sweep: whether prompt-lookup speculation can be on by
default, from what it costs where it cannot help.

For each model (smollm2, the trained default; gpt2-small, random weights whose answers never
copy their prompt, so that no draft is accepted), two servers one after the other: `off`
(LLM_SPECULATIVE_TOKENS=0) and `on` (LLM_SPECULATIVE_TOKENS=8). On each, the main benchmark's
plain prompts over OpenAI streaming completions, `--max-tokens` (64) with ignore_eos, greedy
(temperature 0) and sampled (temperature 1, a seed drawn per request), closed loops at
`--concurrency` (1, 4, 16, 64), max(2C, 12) requests per level (or `--num-requests`).
"""
import argparse
import time
from pathlib import Path
from typing import Optional

from testing.procs import settle

from .load import closed_loop, make_prompts
from .metrics import workload_row
from .models import ensure_model
from .report import figure, measure_each, run_and_write, run_record
from .systems import flow_server, http_session, openai_model_id, this_openai

ARMS = {"off": "0", "on": "8"}
SAMPLING = {"greedy": {}, "sampled": {"temperature": 1.0}}


async def measure_arm(model_name: str, arm: str, args: argparse.Namespace, result: dict) -> None:
    model = ensure_model(model_name, args.models_dir)
    t0 = time.perf_counter()
    with flow_server(model, args.out / "logs", name=f"sweep-{model_name}-{arm}",
                     env={"LLM_SPECULATIVE_TOKENS": ARMS[arm]}) as (_, port):
        async with http_session() as http:
            model_id = await openai_model_id(http, port, model.name)
            for prompt in ("Warm-up: the first call", "Warm-up: and the second"):
                async for _ in this_openai(http, port, model_id, {"ignore_eos": True})(prompt, 4):
                    pass
            print(f"{model_name} {arm}: ready in {time.perf_counter() - t0:.1f}s, quiet after {await settle():.1f}s",
                  flush=True)
            for sampling, extra in SAMPLING.items():
                send = this_openai(http, port, model_id, {"ignore_eos": True, **extra})
                for c in args.concurrency:
                    prompts = make_prompts(256, args.seed, draw=f"closed {c}")
                    n = args.num_requests or max(2 * c, 12)
                    records, duration, cut = await closed_loop(send, prompts, c, n, args.max_tokens, args.time_limit)
                    row = workload_row(f"{model_name} {arm} {sampling}", "plain", c, records, duration, cut)
                    result["rows"].append({**row, "model": model_name, "arm": arm, "sampling": sampling})


def ratios(result: dict) -> list[tuple[str, str, int, Optional[float], Optional[float]]]:
    """(model, sampling, C, off tok/s, on tok/s) for every cell."""
    s = result["settings"]
    return [(m, sampling, c, figure(result, model=m, arm="off", sampling=sampling, concurrency=c),
             figure(result, model=m, arm="on", sampling=sampling, concurrency=c))
            for m in s["models"] for sampling in SAMPLING for c in s["concurrency"]]


def markdown(result: dict) -> str:
    s, m = result["settings"], result["machine"]
    lines = ["# Speculation on against off, where it cannot help", "",
             f"{result['date']}, git {result['git']}, `{result['command']}`", "",
             f"Machine: {m['cpu_count']} CPUs, device {m['device']}, torch {m['torch']}; load average at start "
             f"{m['loadavg_at_start']}. Plain prompts, OpenAI streaming completions, {s['max_tokens']} tokens "
             f"(ignore_eos); on: LLM_SPECULATIVE_TOKENS={ARMS['on']}.", "",
             "| model | sampling | C | off tok/s | on tok/s | on / off |", "|---|---|---|---|---|---|"]
    worst = None
    for model, sampling, c, off, on in ratios(result):
        ratio = on / off if on and off else None
        worst = ratio if ratio is not None and (worst is None or ratio < worst) else worst
        lines.append(f"| {model} | {sampling} | {c} | {off} | {on} | {f'{ratio:.2f}x' if ratio else 'n/a'} |")
    lines += ["", f"Worst cell: {worst:.2f}x." if worst else "No complete cell."]
    if result["notes"]:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in result["notes"]]
    return "\n".join(lines) + "\n"


async def measure(args: argparse.Namespace, result: dict) -> None:
    runs = [f"{model} {arm}" for model in args.models for arm in ARMS]
    await measure_each(runs, lambda run: measure_arm(*run.split(), args, result), result["notes"])


def main(args: argparse.Namespace, machine: dict, argv: Optional[list[str]] = None) -> int:
    result = run_record(argv, machine, settings={"models": args.models, "concurrency": args.concurrency,
                                                 "max_tokens": args.max_tokens, "requests": args.num_requests},
                        rows=[], notes=[])
    code, text = run_and_write(measure(args, result), result, Path(args.out), markdown)
    print("\n" + text)
    return code
