"""The machine's limit beside every speed figure: what one decode stream could reach at best.

A decode step with one stream reads every layer weight and the output layer once (the embeddings
only one row per token), and the keys and values the stream has so far. Memory bandwidth then
bounds it: tokens a second <= bandwidth / bytes a step. A figure is published as its fraction of
that bound; many streams share each weight read, and are bounded by the products' instruction
rate instead (`python -m benchmarks multiply-rate`).

The bandwidth is measured as STREAM's read kernel measures it: a sum over a buffer far larger
than the caches (1 GiB), with the threads the servers run (2 by default), the best of several
passes, which go on until the rate settles: on this project's virtual machines the host backs
memory just filled with huge pages of its own within seconds, and it then reads 1.6x as fast.
The buffer sits on 2 MB pages where the kernel allows, as the engine's weights do
(engine/model/huge_pages.py): on 4 KB pages the same sum read at about half the rate here.
"""
import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import psutil
import torch

from engine.model import huge_pages

from .report import machine_info, write_results

GIB = 1 << 30
EMBEDDINGS = "token_embd.weight"  # llama.cpp's name of the input embeddings
OUTPUT = "output.weight"  # of the output layer; absent where it is the embeddings (tied)


SETTLED = 2.0  # seconds of passes without a better one: the memory's settled rate


def read_bandwidth(size: int = GIB, threads: int = 2, passes: int = 5, limit: float = 30.0) -> float:
    """Bytes a second that `threads` threads read from memory: the best of sums over `size` bytes
    (a float32 sum is far from compute-bound on any CPU with SIMD), at least `passes` of them, and
    on until SETTLED seconds bring no pass 2% faster (at most `limit` s). On this project's virtual
    machines a buffer just filled reads slowly until the host backs it with huge pages of its own:
    a fresh 1 GiB read at 50 GB/s, the same buffer a few seconds later at 83."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        holder = torch.nn.Module()
        holder.register_buffer("buffer", torch.ones(size // 4, dtype=torch.float32))
        huge_pages.collapse(holder)
        buffer = holder.get_buffer("buffer")
        buffer.sum()  # paged in, and the pool's threads started
        best, done = float("inf"), 0
        began = improved = time.perf_counter()
        while done < passes or (time.perf_counter() - improved < SETTLED and time.perf_counter() - began < limit):
            started = time.perf_counter()
            buffer.sum()
            seconds = time.perf_counter() - started
            if seconds < 0.98 * best:
                improved = time.perf_counter()
            best, done = min(best, seconds), done + 1
        return size / best
    finally:
        torch.set_num_threads(previous)


@dataclass(frozen=True)
class StepBytes:
    """What one stream's decode step reads of a GGUF model."""

    weights: int  # the layers' and the output layer's, as stored (quantized)
    kv_per_token: int  # the keys and values of one position, every layer (fp16)

    def at(self, context: int) -> int:
        """The step's bytes with `context` positions in the cache."""
        return self.weights + self.kv_per_token * context


def step_bytes(path: Path, kv_bytes: int = 2) -> StepBytes:
    """A GGUF file's decode-step bytes (`kv_bytes`: the cache's bytes per value, fp16's 2)."""
    from engine.model import gguf_file
    header = gguf_file.read(path)
    tensors = {t.name: t.data.nbytes for t in header.tensors}
    weights = sum(n for name, n in tensors.items() if name != EMBEDDINGS)
    if OUTPUT not in tensors:  # tied: the output layer reads the embeddings whole
        weights += tensors.get(EMBEDDINGS, 0)
    arch = header.metadata["general.architecture"]
    meta = header.metadata
    heads, kv_heads = int(meta[f"{arch}.attention.head_count"]), int(meta.get(f"{arch}.attention.head_count_kv", 0))
    head_dim = int(meta.get(f"{arch}.attention.key_length", int(meta[f"{arch}.embedding_length"]) // heads))
    layers = int(meta[f"{arch}.block_count"])
    return StepBytes(weights, 2 * layers * (kv_heads or heads) * head_dim * kv_bytes)


def bound(bandwidth: float, step: StepBytes, context: int) -> float:
    """One stream's tokens a second at the memory roofline, `context` positions in."""
    return bandwidth / step.at(context)


def fraction(tokens_per_s: float, bandwidth: float, step: StepBytes, context: int) -> float:
    """A measured one-stream rate as its fraction of the roofline."""
    return tokens_per_s / bound(bandwidth, step, context)


STEADY = 0.05  # three decodes in a row within 5% of each other: a server's steady speed


def steady(rates: list[float]) -> bool:
    """Whether the last three of a warm-up's decode rates agree within STEADY. Memory that a process
    has just filled reads slowly for a while on this project's virtual machines (read_bandwidth):
    the 1.17B's one-stream decode in a fresh engine went from 61 to 80 tokens a second over its first 10 s. A
    server's steady speed is what its users see."""
    last = rates[-3:]
    return len(last) == 3 and max(last) - min(last) < STEADY * max(last)


def _quiet(limit: float = 60.0) -> None:
    """Waits (at most `limit` s) until this process and its children use under a tenth of a core:
    the load's copy of the weights onto huge pages runs on after the engine answers."""
    me, ends = psutil.Process(), time.monotonic() + limit

    def used() -> float:
        return sum(sum(p.cpu_times()[:2]) for p in [me, *me.children(recursive=True)])

    before = used()
    while time.monotonic() < ends:
        time.sleep(1.0)
        after = used()
        if after - before < 0.1:
            return
        before = after


def decode_rounds(path: Path, rounds: int, tokens: int, threads: int) -> list[dict[str, float]]:
    """One stream's decode, in this process's engine, and the read bandwidth, in alternating rounds:
    a busy neighbour on a shared machine slows both within a round, and a round's fraction (its
    decode over the roofline of its own reading) is what the goal compares. The step's bytes are
    taken at the stream's middle position."""
    import asyncio

    from contract import EngineConfig, SamplingParams
    from engine import AsyncEngine

    step = step_bytes(path)

    async def decode(engine: AsyncEngine, i: int) -> tuple[float, int]:
        times: list[float] = []
        prompt = f"Story {i}: the river runs past the old mill"
        async for out in engine.generate(prompt, SamplingParams(max_tokens=tokens, ignore_eos=True)):
            times.extend([time.perf_counter()] * len(out.token_ids))
        return (len(times) - 1) / (times[-1] - times[0]), len(engine.tokenizer(prompt).input_ids)

    async def alternate() -> list[dict[str, float]]:
        engine = AsyncEngine(EngineConfig(model=str(path)))
        try:
            _quiet()
            rates: list[float] = []  # warm: the threads, the kernels' first calls, the memory
            ends = time.monotonic() + 180
            while not steady(rates) and time.monotonic() < ends:
                rates.append((await decode(engine, -1 - len(rates)))[0])
            return [await round_of(engine, i) for i in range(rounds)]
        finally:
            engine.shutdown()

    async def round_of(engine: AsyncEngine, i: int) -> dict[str, float]:
        bandwidth = read_bandwidth(threads=threads)  # the engine idle meanwhile
        tok_s, prompt = await decode(engine, i)
        middle = prompt + tokens // 2
        found = {"bandwidth_gb_s": round(bandwidth / 1e9, 1), "decode_tok_s": round(tok_s, 2),
                 "roofline_tok_s": round(bound(bandwidth, step, middle), 2),
                 "fraction": round(fraction(tok_s, bandwidth, step, middle), 3)}
        print(f"round {i + 1}: {found}", flush=True)
        return found

    return asyncio.run(alternate())


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks roofline", description=__doc__.splitlines()[0])
    p.add_argument("gguf", nargs="*", type=Path, help="GGUF files whose one-stream bound to give")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--context", type=int, default=64, help="positions in the cache (default 64)")
    p.add_argument("--decode-rounds", type=int, default=0,
                   help="also run each file's one-stream decode in this process, alternating with the "
                        "bandwidth reading, this many rounds, and give each round's fraction of its roofline")
    p.add_argument("--tokens", type=int, default=128, help="a decode round's tokens")
    p.add_argument("--out", type=Path, help="where --decode-rounds writes results.json and results.md")
    args = p.parse_args(argv)
    if args.decode_rounds:
        lines: list[str] = []
        result: dict[str, Any] = {"command": "python -m benchmarks roofline " + " ".join(argv or sys.argv[1:]),
                                  "machine": machine_info(), "files": {}}
        for path in args.gguf:
            found = decode_rounds(path, args.decode_rounds, args.tokens, args.threads)
            fractions = sorted(r["fraction"] for r in found)
            lines.append(f"{path.name}: one stream's decode, {statistics.median(fractions):.0%} of its roofline "
                         f"(median of {len(found)} rounds; {fractions[0]:.0%} to {fractions[-1]:.0%})")
            result["files"][path.name] = {"median_fraction": statistics.median(fractions), "rounds": found}
            print(lines[-1], flush=True)
        if args.out:
            write_results(args.out, f"{time.strftime('%Y-%m-%d')}, git {result['machine'].get('git')}, "
                                    f"`{result['command']}`\n\n" + "\n".join(f"- {x}" for x in lines) + "\n", result)
        return 0
    bandwidth = read_bandwidth(threads=args.threads)
    print(f"read bandwidth, {args.threads} threads: {bandwidth / 1e9:.1f} GB/s")
    for path in args.gguf:
        step = step_bytes(path)
        print(f"{path.name}: {step.at(args.context) / 1e9:.3f} GB a step at {args.context} positions, "
              f"roofline {bound(bandwidth, step, args.context):.1f} tok/s")
    return 0
