"""python -m benchmarks --replicas: two replicas behind the gateway's router, against round robin
and against one replica, on the default model, in one run.

Each system is a fresh fleet (testing/fleet.py: `jina executor` replicas, each with its share of
the cores, and one `jina gateway`): `router` (2 replicas, cache-aware), `round-robin` (2 replicas,
LLM_ROUTER=round-robin) and `single` (1 replica with both cores). Scenarios, over OpenAI
streaming chat or completions, greedy, `ignore_eos`:

- conversations: 6 at once, each with a system prompt of its own (`--system-tokens`) and 4 turns
  resending the history; the later turns' cached share (cached / prompt tokens) and TTFT;
- shared prompt: 16 users at once behind one system prompt: cached share, TTFT p50 and p99;
- uniform: 32 distinct short prompts, 16 at a time, 64 tokens each: output tok/s, and the load
  spread (the busiest replica's requests over the mean);
- kill (router only): 16 long greedy streams; one replica SIGKILLed mid-way; every stream's text
  against the same streams unbroken, requests sent after the kill, and the longest gap a moved
  stream saw (the time to recover);
- rolling restart (router only): two clients sending without pause while each replica in turn is
  stopped (SIGTERM) and started again: failed requests.
"""
import argparse
import asyncio
import json
import os
import signal
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp

from testing.fleet import LocalFleet

from ..harness.report import run_and_write, run_record
from ..harness.systems import http_session, openai_chunks
from .prefix import chat, system_text

SYSTEMS = {"router": (2, "cache-aware"), "round-robin": (2, "round-robin"), "single": (1, "cache-aware")}


def _p(values: list[float], q: float) -> float:
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))], 1) if values else 0.0


def _share(turns: list[dict]) -> float:
    return round(sum(t["cached_tokens"] or 0 for t in turns) / max(1, sum(t["prompt_tokens"] for t in turns)), 4)


async def conversations(http: aiohttp.ClientSession, port: int, tokenizer: Any, args: argparse.Namespace) -> dict:
    """Six visitors, four turns each (the model: "", none named, the fleet's one)."""
    async def one(c: int) -> list[dict]:
        messages = [{"role": "system", "content": system_text(tokenizer, f"museum number {c}", args.system_tokens)}]
        turns = []
        for turn in range(4):
            messages.append({"role": "user", "content": f"Question {turn + 1} from visitor {c}: what should I see?"})
            turns.append(await chat(http, port, "", messages, args.max_tokens, {}))
            messages.append({"role": "assistant", "content": turns[-1]["text"]})
            await asyncio.sleep(0.2)
        return turns
    later = [t for turns in await asyncio.gather(*(one(c) for c in range(6))) for t in turns[1:]]
    ttft = [t["ttft_ms"] for t in later]
    return {"cached_share": _share(later), "ttft_p50_ms": _p(ttft, 0.5), "ttft_p99_ms": _p(ttft, 0.99)}


async def shared_prompt(http: aiohttp.ClientSession, port: int, tokenizer: Any, args: argparse.Namespace) -> dict:
    system = system_text(tokenizer, "shared science centre", args.system_tokens)
    answers = await asyncio.gather(*(chat(http, port, "", [
        {"role": "system", "content": system}, {"role": "user", "content": f"Visitor {u} asks: where is room {u}?"}],
        args.max_tokens, {}) for u in range(16)))
    ttft = [a["ttft_ms"] for a in answers]
    return {"cached_share": _share(answers), "ttft_p50_ms": _p(ttft, 0.5), "ttft_p99_ms": _p(ttft, 0.99)}


async def completion(http: aiohttp.ClientSession, port: int, prompt: str, max_tokens: int,
                     gaps: bool = False) -> dict:
    """One streamed completion: its text, tokens, and (gaps) the longest pause between chunks."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "ignore_eos": True}
    text, last, longest, chunks = "", time.perf_counter(), 0.0, 0
    async with http.post(f"http://127.0.0.1:{port}/v1/completions", json=body) as resp:
        async for chunk in openai_chunks(resp):
            now = time.perf_counter()
            if chunks:
                longest = max(longest, now - last)
            last, chunks = now, chunks + 1
            text += chunk["choices"][0]["text"]
    return {"text": text, "longest_gap_s": round(longest, 3), "chunks": chunks}


async def uniform(http: aiohttp.ClientSession, port: int, fleet: LocalFleet) -> dict:
    before = [r["routed_total"] for r in fleet.stats()["replicas"]]
    gate = asyncio.Semaphore(16)

    async def one(i: int) -> dict:
        async with gate:
            return await completion(http, port, f"Request {i}: {uuid.uuid4().hex} tell a short story about", 64)
    t0 = time.perf_counter()
    done = await asyncio.gather(*(one(i) for i in range(32)))
    wall = time.perf_counter() - t0
    counts = [a - b for a, b in zip((r["routed_total"] for r in fleet.stats()["replicas"]), before, strict=True)]
    return {"tok_s": round(sum(d["chunks"] for d in done) / wall, 1), "requests_per_replica": counts,
            "spread": round(max(counts) / statistics.mean(counts), 3) if sum(counts) else None}


async def kill(http: aiohttp.ClientSession, port: int, fleet: LocalFleet) -> dict:
    prompts = [f"Long story {i}: once upon a time in a city by the sea" for i in range(16)]
    unbroken = await asyncio.gather(*(completion(http, port, p, 200) for p in prompts))
    streams = [asyncio.ensure_future(completion(http, port, p, 200, gaps=True)) for p in prompts]
    await asyncio.sleep(1.5)
    killed_at = time.perf_counter()
    fleet.signal(0, signal.SIGKILL)
    after = await asyncio.gather(*(completion(http, port, f"after the kill {i}", 16) for i in range(8)),
                                 return_exceptions=True)
    broken = await asyncio.gather(*streams, return_exceptions=True)
    same = sum(1 for b, u in zip(broken, unbroken, strict=True) if isinstance(b, dict) and b["text"] == u["text"])
    moves = fleet.stats()["router"]["migrations"]
    fleet.wait_exit(0)
    fleet.start(0)
    fleet.wait_routable(2)
    return {"streams": 16, "identical_to_unbroken": same, "migrations": moves,
            "after_kill_ok": sum(1 for a in after if isinstance(a, dict)), "after_kill_sent": len(after),
            "longest_gap_s": max((b["longest_gap_s"] for b in broken if isinstance(b, dict)), default=None),
            "all_done_s_after_kill": round(time.perf_counter() - killed_at, 2)}


async def rolling_restart(http: aiohttp.ClientSession, port: int, fleet: LocalFleet) -> dict:
    stop, outcomes = asyncio.Event(), []

    async def client(k: int) -> None:
        while not stop.is_set():
            try:
                outcomes.append(bool((await completion(http, port, f"client {k} {uuid.uuid4().hex}", 48))["text"]))
            except Exception:  # noqa: BLE001 - a failed request
                outcomes.append(False)
    clients = [asyncio.ensure_future(client(k)) for k in range(2)]
    for replica in (0, 1):
        await asyncio.sleep(2.0)
        fleet.signal(replica, signal.SIGTERM)
        await asyncio.to_thread(fleet.wait_exit, replica)
        fleet.start(replica, wait=False)
        await asyncio.to_thread(fleet.wait_executor, replica)
        await asyncio.to_thread(fleet.wait_routable, 2)
    await asyncio.sleep(2.0)
    stop.set()
    await asyncio.gather(*clients)
    return {"requests": len(outcomes), "failed": outcomes.count(False)}


async def measure(args: argparse.Namespace, model: Path, result: dict) -> None:
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    for name in args.replica_systems:
        replicas, policy = SYSTEMS[name]
        env = {"LLM_REPLICAS": str(replicas), "LLM_ROUTER": policy}
        logs = args.out / "logs" / name
        logs.mkdir(parents=True, exist_ok=True)
        print(f"{name}: starting {replicas} replica(s)", flush=True)
        with LocalFleet(str(model), logs, replicas, env) as fleet:
            async with http_session() as http:
                row: dict[str, Any] = {"system": name, "replicas": replicas, "policy": policy}
                row["conversations"] = await conversations(http, fleet.http_port, tokenizer, args)
                row["shared_prompt"] = await shared_prompt(http, fleet.http_port, tokenizer, args)
                row["uniform"] = await uniform(http, fleet.http_port, fleet)
                if name == "router":
                    row["kill"] = await kill(http, fleet.http_port, fleet)
                    row["rolling_restart"] = await rolling_restart(http, fleet.http_port, fleet)
                print(f"  {json.dumps(row)}", flush=True)
                result["rows"].append(row)


def goals(rows: list[dict]) -> list[str]:
    by = {r["system"]: r for r in rows}
    if not {"router", "round-robin", "single"} <= set(by):
        return []
    router, rr, single = by["router"], by["round-robin"], by["single"]
    share = router["conversations"]["cached_share"] / max(1e-9, single["conversations"]["cached_share"])
    speed = router["uniform"]["tok_s"] / max(1e-9, rr["uniform"]["tok_s"])
    kill_row, roll = router.get("kill", {}), router.get("rolling_restart", {})
    return [
        f"later turns' cached share, router / one replica: {share:.3f} (goal >= 0.95; round robin "
        f"{rr['conversations']['cached_share'] / max(1e-9, single['conversations']['cached_share']):.3f})",
        f"uniform load tok/s, router / round robin: {speed:.3f} (goal >= 0.95); busiest replica "
        f"{router['uniform']['spread']}x the mean (goal <= 1.25)",
        f"killed replica under 16 streams: {kill_row.get('identical_to_unbroken')} of 16 identical to an unbroken "
        f"run, {kill_row.get('after_kill_ok')} of {kill_row.get('after_kill_sent')} requests after the kill ok, "
        f"longest gap {kill_row.get('longest_gap_s')} s (goals: 16, all, < 2 s)",
        f"rolling restart: {roll.get('failed')} of {roll.get('requests')} requests failed (goal 0)"]


def markdown(result: dict) -> str:
    lines = [f"# Replicas: router, round robin, one replica ({result['date']}, git {result['git']})", "",
             f"Command: `{result['command']}`", "", "| system | scenario | measure | value |", "| --- | --- | --- | --- |"]
    for row in result["rows"]:
        for scenario in ("conversations", "shared_prompt", "uniform", "kill", "rolling_restart"):
            for key, value in (row.get(scenario) or {}).items():
                lines.append(f"| {row['system']} | {scenario} | {key} | {value} |")
    return "\n".join(lines + ["", "Goals:", ""] + [f"- {g}" for g in goals(result["rows"])] +
                     [""] + [f"- note: {n}" for n in result["notes"]]) + "\n"


def main(args: argparse.Namespace, model: Path, machine: dict, argv: Any = None) -> int:
    args.replica_systems = list(SYSTEMS)
    result = run_record(argv, machine, rows=[], notes=[], settings={
        "model": str(model.name), "system_tokens": args.system_tokens, "max_tokens": args.max_tokens,
        "cores": len(os.sched_getaffinity(0))})
    code, text = run_and_write(measure(args, model, result), result, args.out, markdown)
    print(text)
    return code
