"""python -m benchmarks --prefix: what automatic prefix caching saves, over OpenAI streaming chat.

Default model (smollm2), /v1/chat/completions streamed, greedy, `--max-tokens` (32) per answer
with `ignore_eos` on every system, so every answer has the same length:

- conversation: a system prompt of about 1,000 tokens, then `--turns` (8) user turns, each
  resending the whole history with the previous answers; TTFT, prompt and cached tokens of every
  turn; reported: turn 1 (nothing to reuse) and the median of turns 2 to N;
- shared prompt: `--concurrency` (16) users at once, each another ~1,000-token system prompt
  and a question of its own; TTFT p50 and p99, and the wall clock, first request sent to last
  stream closed.

Systems, one after another in one run: `this` (the cache on, its default), `this-nocache`
(LLM_PREFIX_CACHING=0) and `llama-cpp` (`make llama-cpp`; `cache_prompt` on, its default, and
sent anyway). Each scenario gets a fresh server of each system: a restart empties the service's
prefix cache and llama.cpp's slots alike (the two scenarios' system prompts differ as well).
Then one untimed warm-up request, whose system prompt shares no 16-token block with either
scenario's (first-call costs out of turn 1), and a wait until the server is quiet. TTFT: request
sent to the first chunk with content (the service's role-only first chunk does not count).
Between turns the client waits 0.2 s, a reader's pause, so that each turn meets an idle server.
"""
import argparse
import asyncio
import contextlib
import os
import statistics
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Optional

import aiohttp

from testing.procs import settle

from ..harness.report import run_and_write, run_record
from ..harness.systems import NO_PREFIX_CACHE, flow_server, http_session, llama_server, openai_chunks, openai_model_id

PREFIX_SYSTEMS = ("this", "this-nocache", "llama-cpp")
QUESTIONS = ("Hello! What is this place, and who are you?", "Which rooms should I visit first?",
             "What does rule 3 say?", "And rule 12?", "Which rules are about safety?",
             "Give me an example of how you would apply one of them.", "What should a visitor avoid?",
             "Thank you. Can you sum up our conversation in one sentence?")
FACTS = ("item {i} is kept in room {room} and may be seen from {hour} o'clock",
         "visitors who ask about item {i} are told it is {age} years old",
         "item {i} must not be touched; point visitors to the guide in room {room}",
         "photographs of item {i} are allowed without flash after {hour} o'clock",
         "children under {age} see item {i} only with an adult")
TURN_PAUSE_S = 0.2


def system_text(tokenizer, place: str, tokens: int) -> str:
    """Numbered, deterministic house rules of `place`, just over `tokens` tokens (by the model's
    tokenizer; the chat template adds a few)."""
    lines = [f"You are the assistant at the front desk of the {place}. Answer in one or two friendly "
             "sentences and follow these numbered rules."]
    i = 0
    while len(tokenizer(" ".join(lines))["input_ids"]) < tokens:
        i += 1
        fact = FACTS[i % len(FACTS)].format(i=i, room=i % 9 + 1, hour=8 + i % 10, age=10 + 7 * i % 90)
        lines.append(f"Rule {i}: {fact}.")
    return " ".join(lines)


def slot_tokens(args: argparse.Namespace) -> int:
    """llama.cpp's context per slot (16 slots): the whole conversation, in steps of 1,024 tokens."""
    need = args.system_tokens + args.turns * (args.max_tokens + 48) + 128
    return max(2048, -(-need // 1024) * 1024)


def _warm_up_text(tokenizer, tokens: int) -> str:
    """Starts unlike both scenarios' prompts, so that the cache keeps nothing they could reuse."""
    return "Warm-up text, never reused. " + system_text(tokenizer, "warm-up hall", tokens)


async def chat(http: aiohttp.ClientSession, port: int, model_id: str, messages: list[dict],
               max_tokens: int, extra: dict) -> dict:
    """One streamed chat answer: TTFT and end-to-end time (ms), its text, and the prompt, cached
    and completion tokens the server reports (usage.prompt_tokens_details.cached_tokens, else
    llama.cpp's timings.cache_n; None where it reports neither)."""
    body = {"model": model_id, "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}, **extra}
    parts: list[str] = []
    usage: dict = {}
    timings: dict = {}
    ttft = None
    t0 = time.perf_counter()
    async with http.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body) as resp:
        async for chunk in openai_chunks(resp):
            for choice in chunk.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    ttft = time.perf_counter() - t0 if ttft is None else ttft
                    parts.append(piece)
            usage = chunk.get("usage") or usage
            timings = chunk.get("timings") or timings
    e2e = time.perf_counter() - t0
    if ttft is None:
        raise RuntimeError(f"no content streamed (usage {usage})")
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    source = "usage" if cached is not None else None
    if cached is None and "cache_n" in timings:
        cached, source = timings["cache_n"], "timings.cache_n"
    return {"ttft_ms": round(1000 * ttft, 2), "e2e_ms": round(1000 * e2e, 2),
            "prompt_tokens": usage.get("prompt_tokens"), "cached_tokens": cached, "cached_tokens_from": source,
            "completion_tokens": usage.get("completion_tokens"), "text": "".join(parts)}


@contextlib.asynccontextmanager
async def serve(system: str, model: Path, logs: Path, tag: str,
                slot_size: int) -> AsyncIterator[tuple[int, aiohttp.ClientSession, dict]]:
    """A fresh server of `system`, ready: (HTTP port, HTTP client, extra request fields)."""
    name = f"prefix-{system}-{tag}"
    if system == "llama-cpp":
        async with llama_server(model, logs, ctx_size=16 * slot_size, name=name) as (port, http):
            yield port, http, {"cache_prompt": True}
        return
    env = NO_PREFIX_CACHE if system == "this-nocache" else {"LLM_PREFIX_CACHING": "1"}  # not the shell's
    with flow_server(model, logs, name=name, env=env) as (_, port):
        async with http_session() as http:
            yield port, http, {}


async def _ready(system: str, model: Path, args: argparse.Namespace, tag: str, warm_up: str,
                 stack: contextlib.AsyncExitStack) -> tuple:
    """Starts the server, sends the warm-up request, waits until it is quiet."""
    t0 = time.perf_counter()
    port, http, extra = await stack.enter_async_context(
        serve(system, model, args.out / "logs", tag, slot_tokens(args)))
    model_id = await openai_model_id(http, port, model.name)
    messages = [{"role": "system", "content": warm_up}, {"role": "user", "content": "Ready?"}]
    await chat(http, port, model_id, messages, 4, extra)
    print(f"  {system} ({tag}): ready and warm in {time.perf_counter() - t0:.1f}s, "
          f"quiet after {await settle():.1f}s more", flush=True)
    return port, http, model_id, extra


async def conversation(system: str, model: Path, args: argparse.Namespace, texts: dict) -> dict:
    async with contextlib.AsyncExitStack() as stack:
        port, http, model_id, extra = await _ready(system, model, args, "conversation", texts["warm-up"], stack)
        messages = [{"role": "system", "content": texts["conversation"]}]
        turns = []
        for n in range(args.turns):
            messages.append({"role": "user", "content": QUESTIONS[n % len(QUESTIONS)]})
            turn = await chat(http, port, model_id, messages, args.max_tokens, extra)
            messages.append({"role": "assistant", "content": turn["text"]})
            turns.append({"turn": n + 1, **turn})
            print(f"    turn {n + 1}: TTFT {turn['ttft_ms']:.1f} ms, prompt {turn['prompt_tokens']}, "
                  f"cached {turn['cached_tokens']}, completion {turn['completion_tokens']}", flush=True)
            await asyncio.sleep(TURN_PAUSE_S)
    later = [t["ttft_ms"] for t in turns[1:]]
    return {"turns": turns, "turn1_ttft_ms": turns[0]["ttft_ms"],
            "later_median_ttft_ms": round(statistics.median(later), 2) if later else None,
            "loadavg_1m": round(os.getloadavg()[0], 2)}


async def shared_prompt(system: str, model: Path, args: argparse.Namespace, texts: dict) -> dict:
    users = args.concurrency[0]
    async with contextlib.AsyncExitStack() as stack:
        port, http, model_id, extra = await _ready(system, model, args, "shared", texts["warm-up"], stack)
        t0 = time.perf_counter()
        answers = await asyncio.gather(*(
            chat(http, port, model_id, [{"role": "system", "content": texts["shared"]},
                                           {"role": "user", "content": f"Where is item {u + 1}, and when may I "
                                                                       "see it?"}], args.max_tokens, extra)
            for u in range(users)))
        wall = time.perf_counter() - t0
    ttfts = sorted(a["ttft_ms"] for a in answers)
    result = {"users": users, "ttft_p50_ms": round(_pct(ttfts, 50), 2), "ttft_p99_ms": round(_pct(ttfts, 99), 2),
              "wall_s": round(wall, 3), "answers": list(answers), "loadavg_1m": round(os.getloadavg()[0], 2)}
    print(f"    {users} users: TTFT p50 {result['ttft_p50_ms']:.1f} ms, p99 {result['ttft_p99_ms']:.1f} ms, wall "
          f"{result['wall_s']:.2f} s, cached {[a['cached_tokens'] for a in answers]}", flush=True)
    return result


def _pct(ordered: list[float], q: float) -> float:
    """numpy's linear percentile, as metrics.py's summaries."""
    k = (len(ordered) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


async def measure(model: Path, args: argparse.Namespace, texts: dict, result: dict) -> None:
    for system in args.systems:
        mine = result["systems"].setdefault(system, {})
        for scenario, run_it in (("conversation", conversation), ("shared", shared_prompt)):
            print(f"{system}: {scenario}", flush=True)
            try:
                mine[scenario] = await run_it(system, model, args, texts)
            except Exception as exc:  # noqa: BLE001 - a system that cannot run is a note, not a crash
                result["notes"].append(f"{system} {scenario} failed: {str(exc)[:500]}")
                print(f"  FAILED: {str(exc)[:2000]}", flush=True)


# ----- the report -----
def _figure(result: dict, system: str, scenario: str) -> Optional[float]:
    """The figure a goal compares: the median TTFT of turns 2-N, or the shared prompt's TTFT p50."""
    part = (result["systems"].get(system) or {}).get("conversation" if scenario == "conv" else "shared") or {}
    return part.get("later_median_ttft_ms" if scenario == "conv" else "ttft_p50_ms")


def _ratio_line(label: str, num: Optional[float], den: Optional[float], goal: float, what: str) -> str:
    if not num or not den:
        return f"{label}: n/a"
    ratio = num / den
    return f"{label}: {num:.1f} / {den:.1f} ms = {ratio:.2f}x ({what}: {'met' if ratio >= goal else 'NOT met'})"


def goals(result: dict) -> list[str]:
    def g(system: str, scenario: str) -> Optional[float]:
        return _figure(result, system, scenario)
    return [
        _ratio_line("conversation, median TTFT of turns 2-N, this-nocache / this", g("this-nocache", "conv"),
                    g("this", "conv"), 5, "goal >= 5"),
        _ratio_line("conversation, median TTFT of turns 2-N, llama-cpp / this", g("llama-cpp", "conv"),
                    g("this", "conv"), 1, "goal >= 1: this no higher than llama.cpp"),
        _ratio_line("shared prompt, TTFT p50, this-nocache / this", g("this-nocache", "shared"),
                    g("this", "shared"), 5, "goal >= 5"),
        _ratio_line("shared prompt, TTFT p50, llama-cpp / this", g("llama-cpp", "shared"),
                    g("this", "shared"), 10, "goal >= 10"),
    ]


def _cell(value: Any, fmt: str = "{:.1f}") -> str:
    return "-" if value is None else fmt.format(value)


def markdown(result: dict) -> str:
    s = result["settings"]
    lines = ["# Prefix-caching benchmark", "",
             f"{result['date']}, git {result['git']}, `{result['command']}`", "",
             f"Machine: {result['machine']['cpu_count']} CPUs, device {result['machine']['device']}, torch "
             f"{result['machine']['torch']}; load average at start {result['machine']['loadavg_at_start']}.",
             f"Model {s['model']}; OpenAI streaming chat, greedy, {s['max_tokens']} tokens per answer (ignore_eos); "
             f"system prompts of {result['system_prompt_tokens']} tokens (conversation, shared prompt); a fresh "
             "server per system and scenario. Times in ms.", "",
             f"| system | conversation turn 1 TTFT | turns 2-{s['turns']} median TTFT | cached tokens, turns 2-"
             f"{s['turns']} | shared prompt ({s['users']} users) TTFT p50 | TTFT p99 | wall (s) | cached tokens "
             "(median) |", "|---|---|---|---|---|---|---|---|"]
    for system, r in result["systems"].items():
        conv, shared = r.get("conversation") or {}, r.get("shared") or {}
        cached = [t["cached_tokens"] for t in conv.get("turns", [])[1:]]
        shared_cached = [a["cached_tokens"] for a in shared.get("answers", []) if a["cached_tokens"] is not None]
        lines.append(f"| {system} | {_cell(conv.get('turn1_ttft_ms'))} | {_cell(conv.get('later_median_ttft_ms'))} | "
                     f"{', '.join(map(str, cached)) or '-'} | {_cell(shared.get('ttft_p50_ms'))} | "
                     f"{_cell(shared.get('ttft_p99_ms'))} | {_cell(shared.get('wall_s'), '{:.2f}')} | "
                     f"{_cell(statistics.median(shared_cached) if shared_cached else None, '{:g}')} |")
    systems = [k for k, r in result["systems"].items() if r.get("conversation")]
    if systems:
        lines += ["", "Conversation, turn by turn: TTFT ms (prompt tokens / cached tokens).", "",
                  "| turn | " + " | ".join(systems) + " |", "|---|" + "---|" * len(systems)]
        for n in range(s["turns"]):
            cells = []
            for k in systems:
                turns = result["systems"][k]["conversation"]["turns"]
                t = turns[n] if n < len(turns) else None
                cells.append("-" if t is None else f"{t['ttft_ms']:.1f} ({t['prompt_tokens']} / {t['cached_tokens']})")
            lines.append(f"| {n + 1} | " + " | ".join(cells) + " |")
    lines += ["", "## Goals", ""] + [f"- {g}" for g in goals(result)]
    if result["notes"]:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in result["notes"]]
    return "\n".join(lines) + "\n"


def main(args: argparse.Namespace, model: Path, machine: dict, argv: Optional[list[str]] = None) -> int:
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(model)
    texts = {"conversation": system_text(tokenizer, "city museum", args.system_tokens),
             "shared": system_text(tokenizer, "harbour library", args.system_tokens),
             "warm-up": _warm_up_text(tokenizer, args.system_tokens)}
    result = run_record(
        argv, machine,
        settings={"model": model.name, "systems": args.systems, "turns": args.turns, "users": args.concurrency[0],
                  "max_tokens": args.max_tokens, "system_tokens": args.system_tokens,
                  "llama_cpp_slot_tokens": slot_tokens(args), "turn_pause_s": TURN_PAUSE_S},
        system_prompt_tokens=[len(tokenizer(texts[k])["input_ids"]) for k in ("conversation", "shared")],
        systems={}, notes=[])
    code, text = run_and_write(measure(model, args, texts, result), result, args.out, markdown)
    print("\n" + text)
    print(f"wrote {args.out}/results.json, results.md in {result['settings']['wall_s']}s")
    print("\n".join(["", "Prefix caching (same run):"] + [f"  {g}" for g in goals(result)]))
    return code
