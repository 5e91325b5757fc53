"""python -m benchmarks --speculation-sweep: whether prompt-lookup speculation can be on by
default, from what it costs where it cannot help.

For each model (smollm2, the trained default; gpt2-small, random weights whose answers never
copy their prompt, so that no draft is accepted), two servers side by side: `off`
(LLM_SPECULATIVE_TOKENS=0) and `on` (LLM_SPECULATIVE_TOKENS=8), one of them loaded at a time. On
each, the main benchmark's plain prompts over OpenAI streaming completions, `--max-tokens` (64)
with ignore_eos, greedy (temperature 0) and sampled (temperature 1, a seed drawn per request),
closed loops at `--concurrency` (1, 4, 16, 64), max(2C, 12) requests per level (or
`--num-requests`). The arms take turns cell by cell, `--rounds` times, in alternating order: the
machine's drift over minutes (the noise between two servers run one after the other) falls on both
arms alike, and a cell's figure is its rounds' mean. Each round draws prompts of its own (a
repeated prompt would skip its prefill in the prefix cache), and each cell opens connections of
its own (the server closes a kept connection after five idle seconds, while the other arm runs).
"""
import argparse
import contextlib
import statistics
import time
from pathlib import Path
from typing import Any, Optional

from testing.procs import settle

from ..harness.load import closed_loop, make_prompts
from ..harness.metrics import workload_row
from ..harness.models import ensure_model
from ..harness.report import measure_each, run_and_write, run_record
from ..harness.systems import flow_server, http_session, openai_model_id, this_openai

ARMS = {"off": "0", "on": "8"}
SAMPLING = {"greedy": {}, "sampled": {"temperature": 1.0}}


async def measure_model(model_name: str, args: argparse.Namespace, result: dict) -> None:
    model = ensure_model(model_name, args.models_dir)
    t0 = time.perf_counter()
    with contextlib.ExitStack() as servers:
        ports = {arm: servers.enter_context(flow_server(model, args.out / "logs", name=f"sweep-{model_name}-{arm}",
                                                        env={"LLM_SPECULATIVE_TOKENS": value}))[1]
                 for arm, value in ARMS.items()}
        async with http_session() as http:
            ids = {arm: await openai_model_id(http, port, model.name) for arm, port in ports.items()}
            for arm, port in ports.items():
                for prompt in ("Warm-up: the first call", "Warm-up: and the second"):
                    async for _ in this_openai(http, port, ids[arm], {"ignore_eos": True})(prompt, 4):
                        pass
            print(f"{model_name}: both arms ready in {time.perf_counter() - t0:.1f}s, quiet after "
                  f"{await settle():.1f}s", flush=True)
            for round_ in range(args.rounds):
                for sampling, extra in SAMPLING.items():
                    for c in args.concurrency:
                        # each round's prompts its own (the servers' prefix caches hold the last round's)
                        prompts = make_prompts(256, args.seed, draw=f"closed {c}" + (f" #{round_}" if round_ else ""))
                        n = args.num_requests or max(2 * c, 12)
                        for arm in (ARMS if round_ % 2 == 0 else reversed(list(ARMS))):
                            # connections of its own: a server closes those left idle while the other arm ran
                            async with http_session() as cell:
                                send = this_openai(cell, ports[arm], ids[arm], {"ignore_eos": True, **extra})
                                records, duration, cut = await closed_loop(send, prompts, c, n, args.max_tokens,
                                                                           args.time_limit)
                            row = workload_row(f"{model_name} {arm} {sampling}", "plain", c, records, duration, cut)
                            result["rows"].append({**row, "model": model_name, "arm": arm, "sampling": sampling,
                                                   "round": round_})
                            print(f"  round {round_ + 1} {model_name} {sampling} C={c} {arm}: "
                                  f"{row['output_tok_s']} tok/s", flush=True)


def mean_figure(result: dict, **match: Any) -> Optional[float]:
    """The mean tok/s of the rounds whose rows match; None where a round is missing or cut short."""
    rows = [r for r in result["rows"] if all(r.get(k) == v for k, v in match.items())]
    if len(rows) < result["settings"]["rounds"] or any(r["completed"] != r["requests"] for r in rows):
        return None
    return round(statistics.mean(r["output_tok_s"] for r in rows), 1)


def ratios(result: dict) -> list[tuple[str, str, int, Optional[float], Optional[float]]]:
    """(model, sampling, C, off tok/s, on tok/s) for every cell, each the mean of its rounds."""
    s = result["settings"]
    return [(m, sampling, c, mean_figure(result, model=m, arm="off", sampling=sampling, concurrency=c),
             mean_figure(result, model=m, arm="on", sampling=sampling, concurrency=c))
            for m in s["models"] for sampling in SAMPLING for c in s["concurrency"]]


def markdown(result: dict) -> str:
    s, m = result["settings"], result["machine"]
    lines = ["# Speculation on against off, where it cannot help", "",
             f"{result['date']}, git {result['git']}, `{result['command']}`", "",
             f"Machine: {m['cpu_count']} CPUs, device {m['device']}, torch {m['torch']}; load average at start "
             f"{m['loadavg_at_start']}. Plain prompts, OpenAI streaming completions, {s['max_tokens']} tokens "
             f"(ignore_eos); on: LLM_SPECULATIVE_TOKENS={ARMS['on']}. Both servers side by side, the arms "
             f"alternating cell by cell; each figure is the mean of {s['rounds']} rounds.", "",
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
    await measure_each(args.models, lambda model: measure_model(model, args, result), result["notes"])


def main(args: argparse.Namespace, machine: dict, argv: Optional[list[str]] = None) -> int:
    result = run_record(argv, machine, settings={"models": args.models, "concurrency": args.concurrency,
                                                 "max_tokens": args.max_tokens, "requests": args.num_requests,
                                                 "rounds": args.rounds},
                        rows=[], notes=[])
    code, text = run_and_write(measure(args, result), result, Path(args.out), markdown)
    print("\n" + text)
    return code
