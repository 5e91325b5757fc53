"""python -m benchmarks --structured: what JSON-schema constraints cost, in one run.

(a) Throughput at C=16 over OpenAI chat completions: the same greedy requests with and without
    `response_format: json_schema`, in alternating rounds. The schema asks for more items than
    fit in max_tokens and every request sets ignore_eos, so both arms decode max_tokens per
    request and differ only by the grammar; the output tokens are usage.completion_tokens.
(b) TTFT at C=1: unconstrained, a schema compiled before (cached), and a typical schema seen
    for the first time (a property renamed per request, so every cache misses). The extras are
    medians of each round's difference from its unconstrained request.
(c) Compile time over a corpus of real-world schemas (schema_corpus.py), in this process,
    before the server starts.
"""
import argparse
import asyncio
import json
import os
import statistics
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Optional

import aiohttp

from testing.procs import cpu_seconds, settle

from ..harness.load import Transport, closed_loop, run_request
from ..harness.metrics import RequestRecord, Total, cpu_per_token, summarize
from ..harness.systems import flow_server, http_session, openai_chunks, openai_model_id
from .schema_corpus import compile_corpus

# (a): more objects than 64 tokens can hold, so no constrained answer ends before max_tokens
LIST_SCHEMA = {"type": "object", "additionalProperties": False, "required": ["items"], "properties": {
    "items": {"type": "array", "minItems": 8, "items": {
        "type": "object", "additionalProperties": False, "required": ["name", "country", "description"],
        "properties": {"name": {"type": "string"}, "country": {"type": "string"},
                       "description": {"type": "string"}}}}}}
TOPICS = ("rivers", "mountains", "cities", "inventors", "painters", "novels", "programming languages", "birds",
          "cheeses", "rock bands", "islands", "deserts", "composers", "board games", "spices", "bridges")
TEMPLATES = ("List ten famous {}. For each, give its name, its country and a one-sentence description.",
             "Name ten {} worth knowing about, with the country of each and a short description.",
             "Give me a list of ten {}: name, country, and one sentence about each.")
TTFT_PROMPT = "Invent a person: their name, age, email, address, tags and role."


def typical_schema(name_key: str = "name") -> dict:
    """A typical response_format schema (a person record); `name_key` renames one property so
    that each first-compile request brings a schema no cache has seen."""
    address = {"type": "object", "required": ["street", "city", "country"],
               "properties": {k: {"type": "string"} for k in ("street", "city", "postal_code", "country")}}
    return {"type": "object", "required": [name_key, "age", "email"], "additionalProperties": False,
            "properties": {name_key: {"type": "string"}, "age": {"type": "integer", "minimum": 0},
                           "email": {"type": "string", "format": "email"}, "address": address,
                           "tags": {"type": "array", "items": {"type": "string"}},
                           "role": {"enum": ["admin", "user", "guest"]}}}


def prompts() -> list[str]:
    """48 list-shaped instructions, the same for both arms."""
    return [t.format(topic) for t in TEMPLATES for topic in TOPICS]


def chat_transport(session: aiohttp.ClientSession, port: int, model_id: str,
                   schema: Optional[dict] = None) -> Transport:
    """OpenAI chat completions, streamed, greedy, ignore_eos; with `schema`, response_format
    json_schema. The role-only first chunk is not a token (it is sent before any decoding);
    the usage chunk gives the exact count."""
    extra = {} if schema is None else {
        "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}}

    async def send(prompt: str, max_tokens: int) -> AsyncIterator[int]:
        body = {"model": model_id, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
                "temperature": 0, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}, **extra}
        async with session.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body) as resp:
            async for chunk in openai_chunks(resp):
                if chunk.get("choices") and "role" not in chunk["choices"][0].get("delta", {}):
                    yield 1
                if (chunk.get("usage") or {}).get("completion_tokens") is not None:
                    yield Total(chunk["usage"]["completion_tokens"])
    return send


# ----- (a) throughput -----
async def throughput(arms: dict[str, Transport], args: argparse.Namespace) -> list[dict]:
    """Alternating rounds (unconstrained, constrained, ...) of a closed loop at each level, after
    an untimed wave of each arm (the first wave at a new C ran slower in most trial runs)."""
    rows = []
    for concurrency in args.concurrency:
        n = args.num_requests or 3 * concurrency
        for send in arms.values():  # untimed: the batch's first growth to C rows and full length
            await closed_loop(send, prompts(), concurrency, concurrency, args.max_tokens, args.time_limit)
        for round_ in range(args.rounds):
            for arm, send in arms.items():
                before = cpu_seconds()
                records, duration, cut = await closed_loop(send, prompts(), concurrency, n, args.max_tokens,
                                                           args.time_limit)
                row = {"arm": arm, "concurrency": concurrency, "round": round_, "max_tokens": args.max_tokens,
                       **summarize(records, duration), "cut_short": cut, "loadavg_1m": round(os.getloadavg()[0], 2)}
                row["output_tokens"] = sum(r.tokens for r in records)
                row["cpu_ms_per_token"] = cpu_per_token(before, cpu_seconds(), row["output_tokens"])
                rows.append(row)
                print(f"  {arm} C={concurrency} round {round_}: {row['completed']}/{row['requests']} ok, "
                      f"{row['output_tok_s']} tok/s, {row['tokens_per_request']} tok/request, "
                      f"TTFT p50 {row['ttft_p50_ms']} ms, TPOT p50 {row['tpot_p50_ms']} ms", flush=True)
    return rows


def throughput_summary(rows: list[dict]) -> list[dict]:
    """Per level: each arm's output tokens over its wall clock, all rounds together, and the ratio."""
    out = []
    for concurrency in dict.fromkeys(r["concurrency"] for r in rows):
        level = {"concurrency": concurrency}
        for arm in ("unconstrained", "json_schema"):
            mine = [r for r in rows if r["concurrency"] == concurrency and r["arm"] == arm]
            level[f"{arm}_tok_s"] = round(sum(r["output_tokens"] for r in mine) / sum(r["duration_s"] for r in mine), 1)
            level[f"{arm}_rounds_tok_s"] = [r["output_tok_s"] for r in mine]
            level[f"{arm}_tok_per_request"] = [r["tokens_per_request"] for r in mine]
            level[f"{arm}_errors"] = sum(r["errors"] for r in mine)
        level["ratio"] = round(level["json_schema_tok_s"] / level["unconstrained_tok_s"], 3)
        level["round_ratios"] = [round(c / u, 3) for u, c in zip(level["unconstrained_rounds_tok_s"],
                                                                 level["json_schema_rounds_tok_s"], strict=True)]
        out.append(level)
    return out


# ----- (b) TTFT -----
async def ttft(session: aiohttp.ClientSession, port: int, model_id: str, repeats: int) -> dict:
    """Rounds of three requests at C=1, the order rotating, each on an idle server."""
    kinds = ["unconstrained", "cached", "first_compile"]
    times: dict[str, list[float]] = {k: [] for k in kinds}
    plain, cached = chat_transport(session, port, model_id), chat_transport(session, port, model_id, typical_schema())
    for i in range(repeats):
        for kind in kinds[i % 3:] + kinds[:i % 3]:
            send = {"unconstrained": plain, "cached": cached}.get(kind) or \
                chat_transport(session, port, model_id, typical_schema(f"name_{i}_{time.time_ns()}"))
            records: list[RequestRecord] = []
            await run_request(send, TTFT_PROMPT, 4, records)
            if not records[0].ok:
                raise RuntimeError(f"{kind} request failed: {records[0].error}")
            times[kind].append(1000 * records[0].ttft)
            await asyncio.sleep(0.2)  # the next request meets an idle engine
    return {"repeats": repeats, "loadavg_1m": round(os.getloadavg()[0], 2),
            **{f"{k}_ttft_p50_ms": round(statistics.median(v), 2) for k, v in times.items()},
            "cached_extra_ms": _paired_extra(times["cached"], times["unconstrained"]),
            "first_compile_extra_ms": _paired_extra(times["first_compile"], times["unconstrained"]),
            "ttft_ms": {k: [round(t, 2) for t in v] for k, v in times.items()}}


def _paired_extra(kind: list[float], plain: list[float]) -> float:
    """The median over rounds of (this kind's TTFT - the same round's unconstrained TTFT): the
    three requests of a round are adjacent in time, so drifts of the machine cancel out."""
    return round(statistics.median(a - b for a, b in zip(kind, plain, strict=True)), 2)


# ----- the run -----
async def serve_and_measure(model: Path, args: argparse.Namespace) -> dict:
    """(a) and (b) against `make serve`'s Flow on this model."""
    logs = args.out / "logs"
    with flow_server(model, logs, name="this-structured") as (_, http_port):
        async with http_session() as session:
            model_id = await openai_model_id(session, http_port, model.name)
            arms = {"unconstrained": chat_transport(session, http_port, model_id),
                    "json_schema": chat_transport(session, http_port, model_id, LIST_SCHEMA)}
            cached = chat_transport(session, http_port, model_id, typical_schema())
            for send in (*arms.values(), *arms.values(), cached):  # compiles the two schemas, once each
                await run_request(send, TTFT_PROMPT, 4, [])
            print(f"  server ready; quiet after {await settle():.1f}s", flush=True)
            rows = await throughput(arms, args)
            print("  TTFT at C=1 ...", flush=True)
            first = await ttft(session, http_port, model_id, args.ttft_repeats)
    return {"throughput_rows": rows, "throughput": throughput_summary(rows), "ttft": first}


def run(args: argparse.Namespace, model: Path, notes: list[str], result: dict) -> None:
    """(c) first, in this process while no server runs, then (a) and (b); into `result` as they
    finish, so that an interrupted run keeps what it measured."""
    print("schema corpus: compiling ...", flush=True)
    corpus, per_schema = compile_corpus(model, notes)
    result.update(corpus=corpus, corpus_schemas=[vars(r) for r in per_schema])
    print(f"  {corpus['compiled']}/{corpus['tried']} compiled; p50 {corpus['compile_p50_ms']} ms, "
          f"max {corpus['compile_max_ms']} ms", flush=True)
    print(f"serving {model.name}: starting", flush=True)
    result.update(asyncio.run(serve_and_measure(model, args)))


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def goals(result: dict) -> list[str]:
    """The structured-output goals, against this run's figures."""
    lines = []
    for level in result.get("throughput", []):
        lines.append(f"C={level['concurrency']}: json_schema {level['json_schema_tok_s']} vs unconstrained "
                     f"{level['unconstrained_tok_s']} output tok/s = {level['ratio']:.2f}x "
                     f"(goal >= 0.9x: {_met(level['ratio'] >= 0.9)}; by round {level['round_ratios']})")
    if "ttft" in result:
        t = result["ttft"]
        cached, first = t["cached_extra_ms"], t["first_compile_extra_ms"]
        lines.append(f"TTFT at C=1, medians of {t['repeats']}: unconstrained {t['unconstrained_ttft_p50_ms']} ms, "
                     f"cached schema {cached:+.2f} ms (goal < 5: {_met(cached < 5)}), "
                     f"first compile {first:+.2f} ms (goal < 50: {_met(first < 50)})")
    if "corpus" in result:
        c = result["corpus"]
        lines.append(f"schema corpus: {c['compiled']}/{c['tried']} compiled ({100 * c['coverage']:.1f}%; "
                     f"{c['refused_but_lenient_ok']} of the refused compile with x-guidance lenient); compile "
                     f"p50 {c['compile_p50_ms']} ms, p99 {c['compile_p99_ms']} ms, max {c['compile_max_ms']} ms")
    return lines


def markdown(result: dict, machine: dict, settings: dict, notes: list[str]) -> str:
    lines = ["# Structured-output benchmark", "",
             f"Machine: {machine['cpu_count']} CPUs, device {machine['device']}, torch {machine['torch']}, "
             f"git {machine['git']}, {machine['time']}. Load average at start: {machine['loadavg_at_start']}.",
             f"Settings: {json.dumps(settings)}", "", "## Summary", ""] + [f"- {g}" for g in goals(result)]
    lines += ["", "## Throughput rounds", "", "| arm | C | round | ok/n | out tok/s | tok/request | TTFT p50 | "
              "TPOT p50 | TPOT p99 | CPU ms/token | load 1m |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result.get("throughput_rows", []):
        cpu = ", ".join(f"{k} {v}" for k, v in r["cpu_ms_per_token"].items())
        lines.append(f"| {r['arm']} | {r['concurrency']} | {r['round']} | {r['completed']}/{r['requests']} | "
                     f"{r['output_tok_s']} | {r['tokens_per_request']} | {r['ttft_p50_ms']} | {r['tpot_p50_ms']} | "
                     f"{r['tpot_p99_ms']} | {cpu} | {r['loadavg_1m']} |")
    if "ttft" in result:
        lines += ["", f"## TTFT at C=1 (ms, in order; load 1m after: {result['ttft']['loadavg_1m']})", ""] + \
            [f"- {k}: {v}" for k, v in result["ttft"]["ttft_ms"].items()]
    if "corpus" in result:
        c = result["corpus"]
        lines += ["", "## Schema corpus", "", f"By source (compiled/tried): {c['by_source']}", "",
                  "Slowest:"] + [f"- {s}" for s in c["slowest"]] + ["", "Refused:"] + [f"- {f}" for f in c["failures"]]
    if notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def write(out: Path, result: dict, machine: dict, settings: dict, notes: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "structured.json").write_text(json.dumps(
        {**result, "machine": machine, "settings": settings, "notes": notes}, indent=1))
    (out / "structured.md").write_text(markdown(result, machine, settings, notes))


def main(args: argparse.Namespace, model: Path, machine: dict) -> int:
    notes: list[str] = []
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()
                if k in ("concurrency", "num_requests", "max_tokens", "rounds", "ttft_repeats", "models", "time_limit")}
    t0 = time.perf_counter()
    result: dict[str, Any] = {}
    try:
        run(args, model, notes, result)
    except KeyboardInterrupt:
        notes.append("interrupted: partial results")
    finally:
        settings["wall_s"] = round(time.perf_counter() - t0, 1)
        write(args.out, result, machine, settings, notes)
    print(f"\nwrote {args.out}/structured.json, structured.md in {settings['wall_s']}s")
    print("\n".join(["", "Structured output (same run):"] + [f"  {g}" for g in goals(result)]))
    return 0
