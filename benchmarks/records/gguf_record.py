"""python -m benchmarks --gguf-record: this service against llama.cpp on one GGUF file: Gemma 3 270M
Q4_K_M (a base model), or with `--gguf-file` the default model's own Q4_1 GGUF or llama.cpp's Q4_0
of it (chat models, served here as completions too).

Why: the service serves GGUF files from their own blocks (engine/model/gguf_native.py), so any GGUF
llama.cpp serves can be served here as it is; this measures both on the very same file, the way
cpu_record.py measures the default model (its Target and servers, reused here).

Systems, one after another in one run, each a fresh server warmed by two untimed requests, and
with `--rounds` N, N times over, in alternating order (this, the engine, llama.cpp, then back):
llama.cpp's sixteen-stream figure moved by a quarter between single runs on a shared machine, so
each round's ratio pairs two servers measured minutes apart, and the goal is judged on the
median of the rounds' ratios:
- `this`: `make serve`'s Flow with LLM_MODEL set to the GGUF file, its defaults;
- `this-engine`: the same engine with no serving at all (AsyncEngine in this process, as
  cpu_record.py's): what the Flow, the gateway and HTTP cost beside it, on the same two cores
  (its completions are `this`'s bits, so it has no agreement count of its own);
- `llama-cpp`: llama.cpp's server on the same file, 2 threads, 16 slots (as cpu_record.py starts it).

Workload (cpu_record's plain one): the main benchmark's prompts over OpenAI streaming completions,
greedy, `--max-tokens` (64) with `ignore_eos`, closed loops at `--concurrency` (1 and 16),
`--num-requests` (32) each. Also each system's time from process start to ready (health answers;
READY_GOAL_S for this service) and to its first answered request.

Agreement with the file's fp32 run: AGREEMENT_PROMPTS prompts of their own, each completed alone,
greedy, AGREEMENT_TOKENS tokens (stopping at the end of text, as the reference does), by each
server; a completion agrees when its text is the fp32 run's exactly. The fp32 run is this engine
with `dtype: fp32`, in this process, before the servers: transformers' dequantization of every
tensor, fp32 products and an fp32 KV cache.
"""
import argparse
import asyncio
import contextlib
import statistics
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Optional

import aiohttp

from contract import EngineConfig, SamplingParams
from engine import AsyncEngine
from testing.procs import ROOT, settle

from ..harness.load import closed_loop, make_prompts
from ..harness.metrics import workload_row
from ..harness.report import figure, goal_line, measure_each, run_and_write, run_record, workload_table
from ..harness.systems import flow_server, gguf_of, http_session, llama_server, openai_model_id, raw_engine
from ..peers.llama_cpp import q4_0_of
from .cpu_record import SLOT_TOKENS, Target, _http_target, _uncounted

GGUF_SYSTEMS = ("this", "this-engine", "llama-cpp")
GEMMA = ROOT / "models" / "gemma-3-270m-q4_k_m.gguf"
READY_GOAL_S = 30.0
SPEED_GOALS = {1: 1.2, 16: 2.0}  # this / llama.cpp's tokens per second, by concurrency
AGREEMENT_PROMPTS, AGREEMENT_TOKENS = 16, 32
Complete = Callable[[str], Awaitable[str]]  # a prompt's greedy completion, its text


@contextlib.asynccontextmanager
async def serve(system: str, gguf: Path, logs: Path) -> AsyncIterator[tuple[Target, Optional[Complete]]]:
    """A fresh server of `system` on `gguf`, ready (its health check answers); no completer for
    the engine alone."""
    if system == "this-engine":
        async with raw_engine(gguf, logs, [], sampling={"ignore_eos": True}) as transports:
            yield Target(transports["in-process"], _uncounted), None
        return
    if system == "llama-cpp":
        async with llama_server(gguf, logs, ctx_size=16 * SLOT_TOKENS, name=f"gguf-{system}",
                                gguf=gguf) as (port, http):
            yield await _measured(http, port, gguf)
        return
    with flow_server(gguf, logs, name=f"gguf-{system}") as (_, port):
        async with http_session() as http:
            yield await _measured(http, port, gguf)


async def _measured(http: aiohttp.ClientSession, port: int, gguf: Path) -> tuple[Target, Complete]:
    """A server's timed transport and its completer, on the model id it names (asked once)."""
    model_id = await openai_model_id(http, port, gguf.name)
    return await _http_target(http, port, gguf, model_id), _completer(http, port, model_id)


def _completer(http: aiohttp.ClientSession, port: int, model_id: str) -> Complete:
    async def complete(prompt: str) -> str:
        body = {"model": model_id, "prompt": prompt, "max_tokens": AGREEMENT_TOKENS, "temperature": 0}
        async with http.post(f"http://127.0.0.1:{port}/v1/completions", json=body) as resp:
            resp.raise_for_status()
            return (await resp.json())["choices"][0]["text"]
    return complete


def gguf_file(name: str) -> Path:
    """--gguf-file's file: Gemma's, the default model's own Q4_1 GGUF or llama.cpp's Q4_0 of it, or a path."""
    if name == "gemma":
        return GEMMA
    if name in ("smollm2-q4_1", "smollm2-q4_0"):
        own = gguf_of(ROOT / "models" / "SmolLM2-135M-Instruct")
        return q4_0_of(own) if name.endswith("q4_0") else own
    return Path(name)


def agreement_prompts(seed: int) -> list[str]:
    return make_prompts(AGREEMENT_PROMPTS, seed, draw="fp32 agreement")


async def fp32_answers(gguf: Path, prompts: list[str]) -> list[str]:
    """The file's fp32 run of each prompt (see the module docstring), in this process."""
    engine = AsyncEngine(EngineConfig(model=str(gguf), device="cpu", dtype="fp32"))
    try:
        params = SamplingParams(max_tokens=AGREEMENT_TOKENS, temperature=0)
        answers = await asyncio.gather(*(engine.complete(p, params) for p in prompts))
        return ["".join(o.text for o in outs) for outs in answers]
    finally:
        engine.shutdown()


def rounds_order(systems: list[str], rounds: int) -> list[tuple[str, int]]:
    """(system, round) in the order they run: each round's systems, every other round reversed."""
    return [(system, r) for r in range(rounds) for system in (systems if r % 2 == 0 else systems[::-1])]


async def measure_system(system: str, round_: int, gguf: Path, args: argparse.Namespace, result: dict) -> None:
    t0 = time.perf_counter()
    async with serve(system, gguf, args.out / "logs") as (target, complete):
        ready = {"round": round_, "ready_s": round(time.perf_counter() - t0, 2)}
        for i, prompt in enumerate(("Warm-up: the first call", "Warm-up: and the second")):
            async for _ in target.plain(prompt, 4):
                pass
            if i == 0:
                ready["first_request_s"] = round(time.perf_counter() - t0, 2)
        result["ready"].setdefault(system, []).append(ready)
        print(f"{system}, round {round_ + 1}: ready in {ready['ready_s']}s, first request answered at "
              f"{ready['first_request_s']}s, quiet after {await settle():.1f}s more", flush=True)
        for c in args.concurrency:
            prompts = make_prompts(256, args.seed, draw=f"closed {c}")  # fresh servers: each round the same
            records, duration, cut = await closed_loop(target.plain, prompts, c, max(args.num_requests, c),
                                                       args.max_tokens, args.time_limit)
            result["rows"].append(dict(workload_row(system, "plain", c, records, duration, cut), round=round_))
            await settle()
        if complete is None or round_ > 0:  # greedy: one round's completions are every round's
            return
        reference = result["fp32"]
        texts = [await complete(p) for p in agreement_prompts(args.seed)]
        result["agreement"][system] = sum(a == b for a, b in zip(texts, reference, strict=True))
        print(f"  {system}: {result['agreement'][system]} of {len(texts)} completions are the fp32 run's",
              flush=True)


def tok_s(result: dict, system: str, c: int, round_: int = 0) -> Optional[float]:
    """A system's tokens per second at C=c in one round (None where it failed or was cut short)."""
    rows = [r for r in result["rows"] if r.get("round", 0) == round_]
    return figure({"rows": rows}, system=system, workload="plain", concurrency=c)


def ratio_line(result: dict, c: int, rounds: int) -> str:
    """This / llama.cpp at C=c: one round's figures, or the median of the rounds' ratios."""
    label, goal = f"C={c} plain, this / llama.cpp", SPEED_GOALS.get(c, 1.0)
    if rounds == 1:
        return goal_line(label, tok_s(result, "this", c), tok_s(result, "llama-cpp", c), goal)
    pairs = [(tok_s(result, "this", c, r), tok_s(result, "llama-cpp", c, r)) for r in range(rounds)]
    ratios = [a / b for a, b in pairs if a and b]
    if len(ratios) < rounds:
        return f"{label}: n/a (a round failed or was cut short)"
    median = statistics.median(ratios)
    each = ", ".join(f"{a:g} / {b:g} = {a / b:.2f}x" for a, b in pairs if a and b)
    return (f"{label}: the median of {rounds} rounds' ratios is {median:.2f}x ({each}) (goal >= {goal:g}: "
            f"{'met' if median >= goal else 'NOT met'})")


def goals(result: dict) -> list[str]:
    rounds = result["settings"].get("rounds", 1)
    lines = [ratio_line(result, c, rounds) for c in result["settings"]["concurrency"]]
    for c in result["settings"]["concurrency"]:
        for r in range(rounds):
            served, alone, peer = (tok_s(result, s, c, r) for s in ("this", "this-engine", "llama-cpp"))
            if served and alone and peer:
                lines.append(f"C={c}{f', round {r + 1}' if rounds > 1 else ''}, the engine alone: {alone} tok/s, "
                             f"{alone / peer:.2f}x llama.cpp; the Flow made {served / alone:.2f}x the engine alone's")
    ready = max((r["ready_s"] for r in result["ready"].get("this", [])), default=None)  # the slowest start
    met = "n/a" if ready is None else ("met" if ready <= READY_GOAL_S else "NOT met")
    agree = result.get("agreement", {})
    if "this" in agree and "llama-cpp" in agree:
        verdict = "met" if agree["this"] >= agree["llama-cpp"] else "NOT met"
        lines.append(f"greedy {AGREEMENT_TOKENS}-token completions identical to the fp32 run's: this "
                     f"{agree['this']} of {AGREEMENT_PROMPTS}, llama.cpp {agree['llama-cpp']} (at least as often: "
                     f"{verdict})")
    return lines + [f"this ready within {READY_GOAL_S:g} s of its start: {ready} s ({met})"]


def _by_round(result: dict) -> dict:
    """The rows with each system named with its round, where there are several."""
    if result["settings"].get("rounds", 1) == 1:
        return result
    return {"rows": [dict(r, system=f"{r['system']}, round {r.get('round', 0) + 1}") for r in result["rows"]]}


def markdown(result: dict) -> str:
    s, m = result["settings"], result["machine"]
    lines = ["# One GGUF file, two servers: this service against llama.cpp", "",
             f"{result['date']}, git {result['git']}, `{result['command']}`", "",
             f"Machine: {m['cpu_count']} CPUs, torch {m['torch']}; load average at start {m['loadavg_at_start']}. "
             f"Model {s['model']} (both servers on this file), greedy. plain: OpenAI streaming completions, "
             f"{s['max_tokens']} tokens per request (ignore_eos), {s['requests']} requests per level, "
             f"{s.get('rounds', 1)} round(s) in alternating order, each system a fresh server each round. Both "
             f"servers with their defaults on 2 threads; llama.cpp with 16 slots.", "", *workload_table(_by_round(result))]
    lines += ["", "| system | round | start to ready (s) | start to first answered request (s) |", "|---|---|---|---|"]
    lines += [f"| {name} | {r['round'] + 1} | {r.get('ready_s')} | {r.get('first_request_s')} |"
              for name, runs in result["ready"].items() for r in runs]
    lines += ["", "## Ratios and goals", ""] + [f"- {g}" for g in goals(result)]
    if result["notes"]:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in result["notes"]]
    return "\n".join(lines) + "\n"


def main(args: argparse.Namespace, machine: dict, argv: Optional[list[str]] = None, gguf: Path = GEMMA) -> int:
    result = run_record(argv, machine, settings={
        "model": gguf.name, "systems": args.systems, "concurrency": args.concurrency,
        "max_tokens": args.max_tokens, "requests": args.num_requests, "rounds": args.rounds}, rows=[], ready={},
        notes=[], agreement={})
    started = time.perf_counter()
    result["fp32"] = asyncio.run(fp32_answers(gguf, agreement_prompts(args.seed)))
    print(f"fp32 run: {len(result['fp32'])} completions in {time.perf_counter() - started:.0f}s", flush=True)
    order = {f"{system}, round {r + 1}": (system, r) for system, r in rounds_order(args.systems, args.rounds)}
    measure = measure_each(list(order), lambda name: measure_system(*order[name], gguf, args, result), result["notes"])
    code, text = run_and_write(measure, result, args.out, markdown)
    print("\n" + text)
    print(f"wrote {args.out}/results.json, results.md in {result['settings']['wall_s']}s")
    return code
