"""python -m benchmarks --cpu-record: this service against llama.cpp at its best on this CPU.

The default model (smollm2) in two 4-bit formats: the Q4_1 GGUF it ships as, and a Q4_0 copy
that llama.cpp's own llama-quantize makes of it (`peers/llama_cpp.py`: Q4_0 is what llama.cpp's
CPU backend repacks into interleaved blocks, and what its tinyBLAS prompt kernels take). Each
server runs with its defaults, both on 2 threads; llama.cpp with 16 slots.

Systems, one after another in one run, each a fresh server warmed by two untimed requests:
- `this`: `make serve`'s Flow on the model folder (the Q4_1 weights), its defaults (greedy requests
  speculate);
- `this-engine`: the same engine with no serving at all (AsyncEngine in the benchmark's own
  process, the service's defaults): what the Flow, the gateway and HTTP cost beside it;
- `this-nospec`: the same with speculation off (LLM_SPECULATIVE_TOKENS=0);
- `this-q4_0`: the same Flow on the Q4_0 GGUF (its weights, kept exactly);
- `llama-cpp-q4_1`, `llama-cpp-q4_0`: llama.cpp's server on each file.

Workloads:
- plain: the main benchmark's prompts over OpenAI streaming completions, greedy, `--max-tokens`
  (64) with `ignore_eos`, closed loops at `--concurrency` (1 and 16), `--num-requests` (32) each;
- cold prefill: COLD_REQUESTS prompts of about 1,300 tokens, each new to the server (its first
  words differ), one at a time, one token each: the time to that token.
"""
import argparse
import contextlib
import functools
import statistics
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import aiohttp

from testing.procs import settle

from ..harness.load import Transport, closed_loop, make_prompts
from ..harness.metrics import summarize, workload_row
from ..harness.report import figure, goal_line, measure_each, run_and_write, run_record, workload_table
from ..harness.systems import flow_server, gguf_of, http_session, llama_server, openai_model_id, raw_engine, this_openai
from ..peers.llama_cpp import q4_0_of
from .speculative import PARAGRAPHS

RECORD_SYSTEMS = ("this", "this-engine", "this-nospec", "this-q4_0", "llama-cpp-q4_1", "llama-cpp-q4_0")
COLD_REQUESTS = 5
SLOT_TOKENS = 2048  # llama.cpp's context per slot (of 16): room for a cold prompt
COLD_PARAGRAPHS = 24  # of PARAGRAPHS, repeated: about 1,300 tokens with the default model's tokenizer


def cold_prompt(i: int, paragraphs: int = COLD_PARAGRAPHS) -> str:
    """A long prompt that no earlier one shares a prefix with (about 54 tokens a paragraph)."""
    text = " ".join(p[0] for p in (PARAGRAPHS * (paragraphs // len(PARAGRAPHS) + 1))[:paragraphs])
    return f"Document {i + 1} of the archive, read it carefully.\n\n{text}\n\nSummary:"


@dataclass
class Target:
    """A system ready to measure: its plain transport, and how it counts a prompt's tokens."""
    plain: Transport
    prompt_tokens: Callable[[str], Awaitable[Optional[int]]]


async def _uncounted(prompt: str) -> Optional[int]:
    return None


@contextlib.asynccontextmanager
async def serve(system: str, model: Path, logs: Path) -> AsyncIterator[Target]:
    """A fresh server of `system` (or the engine alone, in this process), ready."""
    if system == "this-engine":
        async with raw_engine(model, logs, [], sampling={"ignore_eos": True}) as transports:
            yield Target(transports["in-process"], _uncounted)
        return
    if system.startswith("llama-cpp"):
        gguf = q4_0_of(gguf_of(model)) if system.endswith("q4_0") else gguf_of(model)
        async with llama_server(model, logs, ctx_size=16 * SLOT_TOKENS, name=f"record-{system}",
                                gguf=gguf) as (port, http):
            yield await _http_target(http, port, model)
        return
    served = q4_0_of(gguf_of(model)) if system == "this-q4_0" else model
    env = {"LLM_SPECULATIVE_TOKENS": "0"} if system == "this-nospec" else {}
    with flow_server(served, logs, name=f"record-{system}", env=env) as (_, port):
        async with http_session() as http:
            yield await _http_target(http, port, model)


async def _http_target(http: aiohttp.ClientSession, port: int, model: Path, model_id: Optional[str] = None) -> Target:
    """The server's OpenAI completions as a Target; `model_id` where the caller asked for it already."""
    model_id = model_id or await openai_model_id(http, port, model.name)
    return Target(this_openai(http, port, model_id, {"ignore_eos": True}),
                  functools.partial(_prompt_tokens, http, port, model_id))


async def measure_system(system: str, model: Path, args: argparse.Namespace, result: dict) -> None:
    t0 = time.perf_counter()
    async with serve(system, model, args.out / "logs") as target:
        for prompt in ("Warm-up: the first call", "Warm-up: and the second"):
            async for _ in target.plain(prompt, 4):
                pass
        print(f"{system}: ready and warm in {time.perf_counter() - t0:.1f}s, quiet after {await settle():.1f}s more",
              flush=True)
        for c in args.concurrency:
            prompts = make_prompts(256, args.seed, draw=f"closed {c}")
            records, duration, cut = await closed_loop(target.plain, prompts, c, max(args.num_requests, c),
                                                       args.max_tokens, args.time_limit)
            result["rows"].append(workload_row(system, "plain", c, records, duration, cut))
        await settle()
        cold = [cold_prompt(i) for i in range(COLD_REQUESTS)]
        records, duration, cut = await closed_loop(target.plain, cold, 1, COLD_REQUESTS, 1, args.time_limit)
        row = {"system": system, "workload": "cold prefill", "concurrency": 1, **summarize(records, duration),
               "cut_short": cut, "prompt_tokens": await target.prompt_tokens(cold[0])}
        counted = f" of {row['prompt_tokens']} tokens" if row["prompt_tokens"] else ""
        print(f"  {system} cold prefill{counted}: TTFT p50 {row['ttft_p50_ms']} ms", flush=True)
        result["rows"].append(row)


async def _prompt_tokens(http: aiohttp.ClientSession, port: int, model_id: str, prompt: str) -> Optional[int]:
    body = {"model": model_id, "prompt": prompt, "max_tokens": 1, "temperature": 0}
    async with http.post(f"http://127.0.0.1:{port}/v1/completions", json=body) as resp:
        usage = (await resp.json()).get("usage") or {}
    return usage.get("prompt_tokens")


# ----- the report -----
def goals(result: dict) -> list[str]:
    def tok_s(system: str, c: int) -> Optional[float]:
        return figure(result, system=system, workload="plain", concurrency=c)

    def ttft(system: str) -> Optional[float]:
        return figure(result, "ttft_p50_ms", system=system, workload="cold prefill", concurrency=1)
    best = "llama-cpp-q4_0"
    return [goal_line("C=1 plain, this / llama.cpp Q4_0", tok_s("this", 1), tok_s(best, 1), 1.2),
            goal_line("C=1 plain, this-nospec / llama.cpp Q4_0", tok_s("this-nospec", 1), tok_s(best, 1), 1.2),
            goal_line("C=1 plain, this-q4_0 / llama.cpp Q4_0 (the very same weights)", tok_s("this-q4_0", 1),
                   tok_s(best, 1), 1.2),
            goal_line("C=16 plain, this / llama.cpp Q4_0", tok_s("this", 16), tok_s(best, 16), 2.0),
            goal_line("cold prefill, llama.cpp Q4_0 TTFT / this TTFT", ttft(best), ttft("this"), 1.5, "ms")]


def markdown(result: dict) -> str:
    s, m = result["settings"], result["machine"]
    lines = ["# The CPU record: this service against llama.cpp at its best", "",
             f"{result['date']}, git {result['git']}, `{result['command']}`", "",
             f"Machine: {m['cpu_count']} CPUs, {result['cpu']}, torch {m['torch']}; load average at start "
             f"{m['loadavg_at_start']}. Model {s['model']}, greedy. plain: OpenAI streaming completions, "
             f"{s['max_tokens']} tokens per request (ignore_eos), {s['requests']} requests per level. cold prefill: "
             f"{COLD_REQUESTS} prompts new to the server, one at a time, one token each. Both servers with their "
             f"defaults on 2 threads; llama.cpp with 16 slots, repacking what its CPU backend repacks.", "",
             *workload_table(result)]
    cold = [r.get("prompt_tokens") for r in result["rows"] if r["workload"] == "cold prefill"]
    lines += ["", f"Cold prompts: {statistics.median([c for c in cold if c] or [0])} tokens (as each server counts).",
              "", "## Goals", ""] + [f"- {g}" for g in goals(result)]
    if result["notes"]:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in result["notes"]]
    return "\n".join(lines) + "\n"


async def measure(model: Path, args: argparse.Namespace, result: dict) -> None:
    await measure_each(args.systems, lambda system: measure_system(system, model, args, result), result["notes"])


def _cpu() -> str:
    from engine.kernels.table import Op, choose
    return f"int4 kernel: {choose(Op.INT4_MATMUL, 'int4')}"


def main(args: argparse.Namespace, model: Path, machine: dict, argv: Optional[list[str]] = None) -> int:
    result = run_record(
        argv, machine, cpu=_cpu(),
        settings={"model": model.name, "systems": args.systems, "concurrency": args.concurrency,
                  "max_tokens": args.max_tokens, "requests": args.num_requests, "cold_requests": COLD_REQUESTS},
        rows=[], notes=[])
    code, text = run_and_write(measure(model, args, result), result, args.out, markdown)
    print("\n" + text)
    print(f"wrote {args.out}/results.json, results.md in {result['settings']['wall_s']}s")
    return code
