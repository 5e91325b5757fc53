"""python -m benchmarks --speculative: one stream against llama.cpp's, and what prompt-lookup
speculation buys where the answer copies its prompt.

Default model (smollm2); llama.cpp's server (`make llama-cpp`) serves the same Q4_1 GGUF with 2
threads and 16 slots. Greedy everywhere.

- plain: the main benchmark's prompts over OpenAI streaming completions, `--max-tokens` (64) per
  request with `ignore_eos`, closed loops at `--concurrency` (1 and 16), `--num-requests` (32)
  per level;
- copying: COPY_TASKS, one request at a time over OpenAI streaming chat: repeat a paragraph
  with one word changed, or extract the sentences that mention something. Up to 160 tokens each,
  and each answer ends where the model ends it.

Systems, one after another in one run, each a fresh server warmed by two untimed requests:
`this` (speculation off: LLM_SPECULATIVE_TOKENS=0), `this-spec` (LLM_SPECULATIVE_TOKENS=8: every request
speculates where it can) and `llama-cpp` (no speculation). The copying answers of `this` and
`this-spec` are compared token for token (the texts, and the completion tokens each reported).
"""
import argparse
import contextlib
import functools
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Optional

import aiohttp

from testing.procs import settle

from ..harness.load import Transport, closed_loop, make_prompts
from ..harness.metrics import Total, workload_row
from ..harness.report import figure, goal_line, measure_each, run_and_write, run_record
from ..harness.systems import (
    SPECULATION,
    flow_server,
    http_session,
    llama_server,
    openai_chunks,
    openai_model_id,
    this_openai,
)

SPEC_SYSTEMS = ("this", "this-spec", "llama-cpp")
SPECULATIVE_TOKENS = int(SPECULATION["LLM_SPECULATIVE_TOKENS"])
COPY_MAX_TOKENS = 160
PARAGRAPHS = (  # (text, a word to change, its replacement, what to extract)
    ("The old lighthouse stood on the northern cliff for two hundred years. Every night its keeper climbed "
     "the one hundred and twelve steps to light the red lamp. Every morning he wrote the weather in a leather "
     "book. Ships passing the rocks trusted the red light more than their own charts.", "red", "green",
     "the keeper"),
    ("Our bakery opens at six in the morning. The first loaves come out of the oven at half past six, and the "
     "croissants follow at seven. On Sundays we also bake a rye bread with caraway seeds. Orders for cakes must "
     "reach us two days in advance.", "Sundays", "Saturdays", "bread"),
    ("The river rises in the hills above the village and runs south for forty kilometres. In spring the melting "
     "snow fills it to the top of its banks. Fishermen wait on the stone bridge for trout in early summer. By "
     "autumn the water is so low that children cross it on foot.", "south", "east", "the water"),
    ("To reset the router, hold the small button on its back for ten seconds. The lights will blink blue while "
     "it restarts. When the light turns steady green, connect to the network named in the label. The default "
     "password is printed under the barcode.", "ten", "fifteen", "the light"),
    ("The library lends books for three weeks. A book may be renewed twice, online or at the front desk, unless "
     "another reader has reserved it. Late books cost twenty cents a day. Children's books never cost anything "
     "when they come back late.", "three", "four", "late books"),
    ("Maria planted tomatoes along the south wall of the garden in May. She watered them every evening and tied "
     "their stems to wooden stakes. By August the plants were taller than she was. She gave the extra tomatoes "
     "to her neighbours in small paper bags.", "evening", "morning", "the plants"),
    ("The train to the coast leaves platform four at nine fifteen. It stops at Millbrook, Ashford and Kingsbay "
     "before it reaches the sea. The journey takes two hours and ten minutes. Tickets bought on the train cost "
     "twice as much as tickets bought at the station.", "four", "seven", "tickets"),
    ("Before the meeting, each team writes a short report of what it finished last week. The reports are shared "
     "an hour before the meeting starts. During the meeting we only discuss problems that block someone. "
     "Decisions are written down in the shared notes the same day.", "hour", "day", "the meeting"),
)
COPY_TASKS = tuple(prompt for text, old, new, topic in PARAGRAPHS for prompt in (
    f"Repeat this paragraph exactly, but change the word '{old}' to '{new}':\n\n{text}",
    f"From this text, copy word for word the sentences that mention {topic}:\n\n{text}"))


def _chat(http: aiohttp.ClientSession, port: int, model_id: str, answers: dict[str, str]) -> Transport:
    """OpenAI streaming chat, greedy: a content chunk counts as one token until the usage chunk
    gives the exact total; each answer's text goes to `answers`, by prompt."""
    async def send(prompt: str, max_tokens: int) -> AsyncIterator[int]:
        body = {"model": model_id, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
                "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
        parts: list[str] = []
        async with http.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body) as resp:
            async for chunk in openai_chunks(resp):
                for choice in chunk.get("choices") or []:
                    piece = (choice.get("delta") or {}).get("content")
                    if piece:
                        parts.append(piece)
                        yield 1
                if (chunk.get("usage") or {}).get("completion_tokens") is not None:
                    yield Total(chunk["usage"]["completion_tokens"])
        answers[prompt] = "".join(parts)
    return send


@contextlib.asynccontextmanager
async def serve(system: str, model: Path, logs: Path) -> AsyncIterator[tuple[int, aiohttp.ClientSession]]:
    """A fresh server of `system`, ready: (HTTP port, HTTP client)."""
    if system == "llama-cpp":
        async with llama_server(model, logs, name="spec-llama-cpp") as (port, http):
            yield port, http
        return
    env = SPECULATION if system == "this-spec" else {"LLM_SPECULATIVE_TOKENS": "0"}  # not the shell's
    with flow_server(model, logs, name=f"spec-{system}", env=env) as (_, port):
        async with http_session() as http:
            yield port, http


async def measure_system(system: str, model: Path, args: argparse.Namespace, result: dict) -> None:
    t0 = time.perf_counter()
    async with serve(system, model, args.out / "logs") as (port, http):
        model_id = await openai_model_id(http, port, model.name)
        plain = this_openai(http, port, model_id, {"ignore_eos": True})
        answers: dict[str, str] = {}
        copying = _chat(http, port, model_id, answers)
        for send, prompt in ((plain, "Warm-up: the first call"), (copying, "Warm-up: say hello.")):
            async for _ in send(prompt, 4):
                pass
        print(f"{system}: ready and warm in {time.perf_counter() - t0:.1f}s, quiet after {await settle():.1f}s more",
              flush=True)
        for c in args.concurrency:
            prompts = make_prompts(256, args.seed, draw=f"closed {c}")  # as the main benchmark's levels
            records, duration, cut = await closed_loop(plain, prompts, c, max(args.num_requests, c), args.max_tokens,
                                                       args.time_limit)
            result["rows"].append(workload_row(system, "plain", c, records, duration, cut))
        records, duration, cut = await closed_loop(copying, list(COPY_TASKS), 1, len(COPY_TASKS), COPY_MAX_TOKENS,
                                                   args.time_limit)
        row = workload_row(system, "copying", 1, records, duration, cut)
        row["completion_tokens"] = [r.tokens for r in records]
        result["rows"].append(row)
        result["answers"][system] = [answers.get(p) for p in COPY_TASKS]


# ----- the report -----
_goal = functools.partial(goal_line, fmt=".1f")  # as its published runs print them


def goals(result: dict) -> list[str]:
    def t(system: str, workload: str, c: int) -> Optional[float]:
        return figure(result, system=system, workload=workload, concurrency=c)
    plain, spec = result["answers"].get("this"), result["answers"].get("this-spec")
    same = "n/a" if not plain or not spec else (
        f"{sum(a == b for a, b in zip(plain, spec, strict=True))} of {len(plain)} answers identical")
    return [_goal("C=1 plain, this / llama-cpp", t("this", "plain", 1), t("llama-cpp", "plain", 1), 1.0),
            _goal("C=1 copying, this-spec / this", t("this-spec", "copying", 1), t("this", "copying", 1), 1.8)
            + f"; {same}",
            _goal("C=16 plain, this / llama-cpp", t("this", "plain", 16), t("llama-cpp", "plain", 16), 2.0),
            _goal("C=16 plain, this-spec / this (speculation on does not slow a full batch)",
                   t("this-spec", "plain", 16), t("this", "plain", 16), 0.95)]


def markdown(result: dict) -> str:
    s, m = result["settings"], result["machine"]
    lines = ["# Speculative decoding and one stream", "", f"{result['date']}, git {result['git']}, "
             f"`{result['command']}`", "",
             f"Machine: {m['cpu_count']} CPUs, device {m['device']}, torch {m['torch']}; load average at start "
             f"{m['loadavg_at_start']}. Model {s['model']}, greedy. plain: OpenAI streaming completions, "
             f"{s['max_tokens']} tokens per request (ignore_eos), {s['requests']} requests per level. copying: "
             f"{len(COPY_TASKS)} OpenAI streaming chat requests one at a time, up to {COPY_MAX_TOKENS} tokens, "
             f"ending where the model ends them. this-spec: LLM_SPECULATIVE_TOKENS={SPECULATIVE_TOKENS}.", "",
             "| system | workload | C | output tok/s | TTFT p50 (ms) | TPOT p50 (ms) | ITL p50 (ms) | tokens | ok |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['system']} | {r['workload']} | {r['concurrency']} | {r['output_tok_s']} | "
                     f"{r['ttft_p50_ms']} | {r['tpot_p50_ms']} | {r['itl_p50_ms']} | "
                     f"{r['tokens_per_request'] * r['requests'] if r['tokens_per_request'] else '-'} | "
                     f"{r['completed']}/{r['requests']} |")
    lines += ["", "## Goals", ""] + [f"- {g}" for g in goals(result)]
    if result["notes"]:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in result["notes"]]
    return "\n".join(lines) + "\n"


async def measure(model: Path, args: argparse.Namespace, result: dict) -> None:
    await measure_each(args.systems, lambda system: measure_system(system, model, args, result), result["notes"])


def main(args: argparse.Namespace, model: Path, machine: dict, argv: Optional[list[str]] = None) -> int:
    result = run_record(
        argv, machine,
        settings={"model": model.name, "systems": args.systems, "concurrency": args.concurrency,
                  "max_tokens": args.max_tokens, "requests": args.num_requests,
                  "speculative_tokens": SPECULATIVE_TOKENS, "copy_max_tokens": COPY_MAX_TOKENS},
        copy_tasks=list(COPY_TASKS), rows=[], answers={}, notes=[])
    code, text = run_and_write(measure(model, args, result), result, args.out, markdown)
    print("\n" + text)
    print(f"wrote {args.out}/results.json, results.md in {result['settings']['wall_s']}s")
    return code
