"""python -m benchmarks.prefix_cache_bench: what prefix caching saves a conversation and users
who share a system prompt, against the same service without it and llama.cpp's server.

Default model, OpenAI streaming chat, greedy, 32 tokens per answer (ignore_eos on every system):
- conversation: a system prompt of about 1,000 tokens, then 8 user turns, each resending the
  whole history with the previous answers; TTFT of turn 1 (cold) and the median of turns 2 to 8;
- shared prompt: 16 users at once, another system prompt of about 1,000 tokens each with a
  different question; TTFT p50 and p99.
Systems, one after another in one run, each started fresh: this service with the cache (its
default), this service with LLM_PREFIX_CACHING=0, and llama.cpp's server (`make llama-cpp`;
`cache_prompt` on, its default; 2 threads, 16 slots of 4,096 tokens).
"""
import argparse
import asyncio
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
from transformers import AutoTokenizer

from testing.flows import start_flow
from testing.procs import ServerProcess, free_port

from .systems import LLAMA_SERVER, _env, gguf_of

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "models" / "SmolLM2-135M-Instruct"
TURNS = ["Who are you?", "What can you help me with?", "Summarize rule 3.", "And rule 7?",
         "Which rule is about safety?", "Give me an example of it.", "What should I avoid?", "Thank you, goodbye."]


def system_prompt(tokenizer, subject: str, tokens: int = 1000) -> str:
    """Numbered house rules about `subject`, just over `tokens` tokens long."""
    lines = [f"You are the assistant of the {subject}. Follow these rules."]
    i = 0
    while len(tokenizer(" ".join(lines))["input_ids"]) < tokens:
        i += 1
        lines.append(f"Rule {i}: when a visitor asks about item {i} of the {subject}, answer in one short, "
                     f"friendly sentence and mention that item {i} is in room {i % 9 + 1}.")
    return " ".join(lines)


async def chat(session: aiohttp.ClientSession, port: int, messages: list[dict], tokens: int) -> dict:
    """One streamed answer: its text, TTFT, and what usage reports (cached tokens where given)."""
    body = {"model": "m", "messages": messages, "max_tokens": tokens, "temperature": 0, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}
    started, ttft, text, usage, timings = time.perf_counter(), None, "", {}, {}
    async with session.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body) as resp:
        resp.raise_for_status()
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            for choice in chunk.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    ttft = ttft if ttft is not None else time.perf_counter() - started
                    text += piece
            usage = chunk.get("usage") or usage
            timings = chunk.get("timings") or timings
    details = usage.get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens", timings.get("cache_n"))
    return {"ttft": ttft, "text": text, "prompt_tokens": usage.get("prompt_tokens"), "cached_tokens": cached}


def session() -> aiohttp.ClientSession:
    """A connection per request: llama-server exits when a kept-alive one is reused."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=True),
                                 timeout=aiohttp.ClientTimeout(total=None, sock_read=600))


async def conversation(port: int, system: str, tokens: int) -> list[dict]:
    messages, turns = [{"role": "system", "content": system}], []
    async with session() as client:
        for question in TURNS:
            messages.append({"role": "user", "content": question})
            turn = await chat(client, port, messages, tokens)
            messages.append({"role": "assistant", "content": turn["text"]})
            turns.append(turn)
    return turns


async def shared(port: int, system: str, tokens: int, users: int) -> tuple[list[dict], float]:
    started = time.perf_counter()
    async with session() as client:
        answers = await asyncio.gather(*(chat(client, port, [{"role": "system", "content": system},
                                                              {"role": "user", "content": f"Where is item {i}?"}],
                                              tokens) for i in range(users)))
    return list(answers), time.perf_counter() - started


@contextlib.asynccontextmanager
async def this_service(cache: bool, tmp: Path) -> AsyncIterator[int]:
    server, _, http_port = start_flow(str(MODEL), tmp, env={} if cache else {"LLM_PREFIX_CACHING": "0"})
    try:
        yield http_port
    finally:
        server.stop()


@contextlib.asynccontextmanager
async def llama_cpp(tmp: Path) -> AsyncIterator[int]:
    if not LLAMA_SERVER.exists():
        raise RuntimeError("not built: run `make llama-cpp` first")
    port = free_port()
    cmd = [str(LLAMA_SERVER), "-m", str(gguf_of(MODEL)), "--host", "127.0.0.1", "--port", str(port),
           "--parallel", "16", "--threads", "2", "--ctx-size", str(16 * 4096), "--cont-batching"]
    server = ServerProcess(cmd, tmp / "llama-cpp.log", _env(LD_LIBRARY_PATH=str(LLAMA_SERVER.parent)))
    try:
        async with session() as client:
            for _ in range(360):  # /health answers 503 while the model loads
                with contextlib.suppress(aiohttp.ClientError):
                    async with client.get(f"http://127.0.0.1:{port}/health") as resp:
                        if resp.status == 200:
                            break
                server.check_alive()
                await asyncio.sleep(0.5)
        yield port
    finally:
        server.stop()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def run_system(name: str, tokenizer, args: argparse.Namespace, tmp: Path) -> dict:
    talk, crowd = system_prompt(tokenizer, "city museum"), system_prompt(tokenizer, "harbour library")
    context = llama_cpp(tmp) if name == "llama.cpp" else this_service(name == "this-cache-on", tmp)
    async with context as port:
        turns = await conversation(port, talk, args.tokens)
        answers, wall = await shared(port, crowd, args.tokens, args.users)
    ttfts = [a["ttft"] for a in answers]
    return {"conversation": turns, "turn1_ttft": turns[0]["ttft"],
            "turns2_8_median_ttft": statistics.median(t["ttft"] for t in turns[1:]),
            "shared": {"ttft_p50": statistics.median(ttfts), "ttft_p99": pct(ttfts, 0.99), "wall_s": wall,
                       "cached_tokens": [a["cached_tokens"] for a in answers],
                       "prompt_tokens": answers[0]["prompt_tokens"]}}


def table(results: dict, users: int) -> str:
    rows = [f"| system | conversation: turn 1 TTFT (cold) | turns 2-8: median TTFT | shared prompt, {users} users at once: "
            "TTFT p50 / p99 |",
            "| --- | --- | --- | --- |"]
    for name, r in results.items():
        rows.append(f"| {name} | {r['turn1_ttft']:.2f} s | {r['turns2_8_median_ttft']:.3f} s | "
                    f"{r['shared']['ttft_p50']:.2f} s / {r['shared']['ttft_p99']:.2f} s |")
    return "\n".join(rows)


def goals(results: dict) -> dict:
    on, off, llama = (results.get(k) for k in ("this-cache-on", "this-cache-off", "llama.cpp"))
    out = {}
    if on and off:
        out["conversation: off / on (goal >= 5)"] = off["turns2_8_median_ttft"] / on["turns2_8_median_ttft"]
        out["shared p50: off / on (goal >= 5)"] = off["shared"]["ttft_p50"] / on["shared"]["ttft_p50"]
    if on and llama:
        out["conversation: llama.cpp / on (goal >= 1)"] = llama["turns2_8_median_ttft"] / on["turns2_8_median_ttft"]
        out["shared p50: llama.cpp / on (goal >= 10)"] = llama["shared"]["ttft_p50"] / on["shared"]["ttft_p50"]
    return out


async def main(args: argparse.Namespace) -> dict:
    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.systems:
            results[name] = await run_system(name, tokenizer, args, Path(tmp))
            print(f"{name}: done", file=sys.stderr)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit.stdout.strip(),
            "command": "python -m benchmarks.prefix_cache_bench " + " ".join(sys.argv[1:]),
            "tokens": args.tokens, "users": args.users, "results": results, "goals": goals(results)}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "prefix-cache")
    parser.add_argument("--systems", type=lambda s: s.split(","),
                        default=["this-cache-on", "this-cache-off", "llama.cpp"])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--users", type=int, default=16)
    options = parser.parse_args()
    report = asyncio.run(main(options))
    out = options.out
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(report, indent=1))
    text = (f"# Prefix caching: a conversation and a shared prompt\n\n{report['date']}, commit {report['commit']}, "
            f"`{report['command']}`\n\n{table(report['results'], report['users'])}\n\n"
            + "\n".join(f"- {k}: {v:.1f}x" for k, v in report["goals"].items()) + "\n")
    (out / "README.md").write_text(text)
    print(text)
