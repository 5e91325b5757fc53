"""python -m benchmarks sizes: this service against llama.cpp at every model size, one table.

    python -m benchmarks sizes [--sizes 135m,270m,1b,1.5b,3b,8b] [--out DIR]

Each size is one GGUF file, served by both: the default model's own Q4_1 GGUF (135M), Gemma 3
270M Q4_K_M, and the random-weight shapes that `python -m benchmarks sized-models NAME --quant
Q4_K_M` makes (Llama's 1B, 3B and 8B, Qwen 2.5's 1.5B, Gemma 3 1B's layers as `1b-gemma3`; a size whose file
is not made is skipped, and said so).

For each size, each system is a fresh server on the same file, one after the other (`--rounds`:
again and again, the order reversed every other round, each figure the median): this
service (`make serve`'s Flow, its defaults) and llama.cpp's server (2 threads, 16 slots), both
over OpenAI streaming completions, greedy, `--max-tokens` (64) with ignore_eos:
- one stream and sixteen: closed loops, output tokens a second (each request's prefill included);
- one stream's decode: the tokens a second after the first (1 / the median time per output token);
- a cold prompt of about 1,600 tokens that no earlier one shares, one at a time: its tokens over
  the time to its first token;
- the peak resident memory of every process of the server, sampled while it runs;
- before the measures, each server decodes one stream until its speed is steady
  (`--steady-limit`): memory a process has just filled reads slowly for a while on a virtual
  machine whose host backs it with huge pages later (harness/roofline.py);
- one stream, and its decode, as fractions of the memory roofline (harness/roofline.py: the read
  bandwidth, its settled rate, over the bytes a step reads of the file's weights and 64 positions'
  KV). The roofline bounds a decode step; the end-to-end figure also waits for prefills.
"""
import argparse
import asyncio
import statistics
import time
from pathlib import Path
from typing import Any, Optional

import psutil

from engine.torch_vectors import cpu_flags
from testing.procs import ROOT, settle

from ..harness import roofline
from ..harness.load import closed_loop, make_prompts, run_request
from ..harness.metrics import RequestRecord, summarize
from ..harness.report import machine_info, write_results
from ..harness.sized_models import CACHE
from .cpu_record import cold_prompt
from .gguf_record import GEMMA, gguf_file, serve

SYSTEMS = ("this", "llama-cpp")
SIZES = {"135m": "smollm2-q4_1", "270m": str(GEMMA), "1b": str(CACHE / "llama-1b-Q4_K_M.gguf"),
         "1.5b": str(CACHE / "qwen2.5-1.5b-Q4_K_M.gguf"), "3b": str(CACHE / "llama-3b-Q4_K_M.gguf"),
         "8b": str(CACHE / "llama-8b-Q4_K_M.gguf"), "1b-gemma3": str(CACHE / "gemma3-1b-Q4_K_M.gguf"),
         # the 1.17B's other quantizations (`python -m benchmarks sized-models llama-1b --quant Q4_0 --quant Q8_0`)
         "1b-q4_0": str(CACHE / "llama-1b-Q4_0.gguf"), "1b-q8_0": str(CACHE / "llama-1b-Q8_0.gguf")}
COLD_PARAGRAPHS, COLD_PROMPTS, CONTEXT = 30, 3, 64  # 30 paragraphs: about 1,600 tokens (SmolLM2's tokenizer)


def cpu_kind() -> str:
    """The CPU's model name and widest vector kind, as /proc/cpuinfo gives them."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "?")
    flags = cpu_flags()
    kind = "AVX-512" if "avx512bw" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    return f"{name}, {psutil.cpu_count()} CPUs, {kind}"


async def _peak_rss(peak: list[int], stop: asyncio.Event) -> None:
    """The most resident memory that this process's children (the server's processes) held together."""
    me = psutil.Process()
    while not stop.is_set():
        total = 0
        for child in me.children(recursive=True):
            try:
                total += child.memory_info().rss
            except psutil.Error:
                pass
        peak[0] = max(peak[0], total)
        try:
            await asyncio.wait_for(stop.wait(), 0.25)
        except TimeoutError:
            pass


WARM_AT_LEAST = 20.0  # seconds: the 1.17B's decode in a fresh engine rose over its first 10


async def warm_until_steady(target: Any, limit: float, seed: int) -> dict:
    """One-stream requests of 64 tokens for WARM_AT_LEAST seconds and then until their decode rates
    are steady (roofline.steady), or for `limit` seconds; a peer that maps its model's file from
    the page cache starts on memory the host settled long before."""
    rates: list[float] = []
    prompts, started = make_prompts(64, seed, draw="steady"), time.perf_counter()
    while (time.perf_counter() - started < min(WARM_AT_LEAST, limit) or not roofline.steady(rates)) \
            and time.perf_counter() - started < limit:
        records: list[RequestRecord] = []
        await run_request(target.plain, prompts[len(rates) % len(prompts)], 64, records)
        tpot = records[0].tpot if records[0].ok else None
        if tpot:
            rates.append(round(1 / tpot, 1))
    return {"warm_s": round(time.perf_counter() - started, 1), "warm_decode_tok_s": rates}


async def measure(system: str, gguf: Path, args: argparse.Namespace) -> dict:
    peak, stop = [0], asyncio.Event()
    sampler = asyncio.create_task(_peak_rss(peak, stop))
    started = time.perf_counter()
    row: dict = {"system": system}
    try:
        async with serve(system, gguf, args.out / "logs") as (target, _):
            row["ready_s"] = round(time.perf_counter() - started, 1)
            for prompt in ("Warm-up: the first call", "Warm-up: and the second"):
                async for _ in target.plain(prompt, 4):
                    pass
            await settle()
            if args.steady_limit:
                row |= await warm_until_steady(target, args.steady_limit, args.seed)
            for c, n in ((1, args.one_stream_requests), (16, args.sixteen_stream_requests)):
                prompts = make_prompts(256, args.seed, draw=f"closed {c}")
                records, duration, cut = await closed_loop(target.plain, prompts, c, n, args.max_tokens, 900)
                figures = summarize(records, duration)
                row[f"c{c}_tok_s"] = None if cut else figures["output_tok_s"]
                if c == 1 and not cut and figures["tpot_p50_ms"]:  # the decode alone, without the prompts' prefill
                    row["c1_decode_tok_s"] = round(1000 / figures["tpot_p50_ms"], 1)
                await settle()
            cold = [cold_prompt(i, COLD_PARAGRAPHS) for i in range(args.cold_prompts)]
            records, duration, _ = await closed_loop(target.plain, cold, 1, args.cold_prompts, 1, 900)
            ttft_ms = summarize(records, duration)["ttft_p50_ms"]
            count = await target.prompt_tokens(cold[0])  # after: counting serves it, and caches its prefix
            row["cold_prompt_tokens"] = count
            row["cold_prompt_tok_s"] = round(1000 * count / ttft_ms, 1) if count and ttft_ms else None
    finally:
        stop.set()
        await sampler
    row["peak_rss_gb"] = round(peak[0] / 1e9, 2)
    print(f"  {system}: {row}", flush=True)
    return row


def head(subcommand: str, argv: Optional[list[str]], **fields: Any) -> dict:
    """A record's results.json head: the date, the commit, the CPU and the exact command, then `fields`."""
    return {"date": time.strftime("%Y-%m-%d"), "git": machine_info().get("git"), "cpu": cpu_kind(),
            "command": f"python -m benchmarks {subcommand} " + " ".join(argv or []), **fields}


def ratio(a: Optional[float], b: Optional[float]) -> str:
    return f"{a / b:.2f}x" if a and b else "n/a"


def _readings(result: dict) -> str:
    readings = result.get("bandwidth_readings_gb_s") or []
    return f" (the highest of {len(readings)} readings, before the run and after each server; the lowest " \
           f"{min(readings)})" if len(readings) > 1 else ""


def table(result: dict) -> str:
    bandwidth = result["bandwidth_gb_s"]
    lines = [f"# This service and llama.cpp at every size ({result['cpu']})", "",
             f"{result['date']}, git {result['git']}, `{result['command']}`; read bandwidth with 2 threads "
             f"{bandwidth} GB/s{_readings(result)}. Each cell: this / llama.cpp (and their ratio). One stream's roofline: the "
             f"bandwidth over a step's bytes (the file's layer and output weights, {CONTEXT} positions' KV).", "",
             "| size | file | one stream, tok/s | of the roofline | one stream's decode, tok/s | of the roofline "
             "| sixteen streams, tok/s | cold prompt, prompt tok/s | peak memory, GB |",
             "|---|---|---|---|---|---|---|---|---|"]
    for size, entry in result["sizes"].items():
        if "this" not in entry or "llama-cpp" not in entry:
            continue
        this, peer = entry["this"], entry["llama-cpp"]
        bound = entry["roofline_tok_s"]
        cells = []
        for key in ("c1_tok_s", "c1_decode_tok_s", "c16_tok_s", "cold_prompt_tok_s", "peak_rss_gb"):
            cells.append(f"{this.get(key)} / {peer.get(key)} ({ratio(this.get(key), peer.get(key))})")
            if key.startswith("c1_"):
                cells.append(f"{this[key] / bound:.0%} / {peer[key] / bound:.0%} of {bound:.1f}"
                             if this.get(key) and peer.get(key) else "n/a")
        lines.append(f"| {size} | {entry['file']} | " + " | ".join(cells) + " |")
    lines += [""] + [f"- {note}" for note in result["notes"]]
    return "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks sizes", description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default=",".join(s for s in SIZES if "-" not in s),  # the Q4_K_M files
                   help=f"of {', '.join(SIZES)}")
    p.add_argument("--systems", default=",".join(SYSTEMS),
                   help="of this, llama-cpp and this-engine (the engine alone, in this process: what serving costs)")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--one-stream-requests", type=int, default=8)
    p.add_argument("--sixteen-stream-requests", type=int, default=32,
                   help="16: one request each, what an 8B allows within the loop's 900 s on two cores")
    p.add_argument("--cold-prompts", type=int, default=COLD_PROMPTS)
    p.add_argument("--steady-limit", type=float, default=180.0,
                   help="seconds each server may decode one stream before the measures, until its speed is "
                        "steady (0: measure at once, as before)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rounds", type=int, default=1,
                   help="fresh servers each round, the systems' order reversed every other round (ABBA); "
                        "each figure the median of its rounds")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "sizes")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    result = head("sizes", argv, sizes={}, notes=[])
    readings = [roofline.read_bandwidth()]
    steps: dict[str, roofline.StepBytes] = {}
    for size in args.sizes.split(","):
        gguf = gguf_file(SIZES[size])
        if not gguf.exists():
            result["notes"].append(f"{size}: {gguf.name} not made; skipped")
            continue
        steps[size] = roofline.step_bytes(gguf)
        entry = {"file": gguf.name, "step_gb": round(steps[size].at(CONTEXT) / 1e9, 3)}
        print(f"{size}: {gguf.name}, {entry['step_gb']} GB a step", flush=True)
        systems, rounds = args.systems.split(","), {}
        for r in range(args.rounds):  # ABBA...: a drift of the machine's speed falls on both alike
            for system in systems if r % 2 == 0 else systems[::-1]:
                rounds.setdefault(system, []).append(asyncio.run(measure(system, gguf, args)))
                readings.append(roofline.read_bandwidth())
        for system in systems:
            entry[system] = median_row(rounds[system])
            if args.rounds > 1:
                entry[f"{system}_rounds"] = rounds[system]
        result["sizes"][size] = entry
    with_rooflines(result, steps, readings)
    write_results(args.out, table(result), result)
    return 0


def median_row(rows: list[dict]) -> dict:
    """Each figure's median over a system's rounds (None where a round has none)."""
    merged = dict(rows[0])
    for key, value in rows[0].items():
        values = [row.get(key) for row in rows]
        if isinstance(value, (int, float)) and all(isinstance(v, (int, float)) for v in values):
            merged[key] = round(statistics.median(values), 2)
        elif any(v is None for v in values):
            merged[key] = None
    return merged


def with_rooflines(result: dict, steps: dict[str, "roofline.StepBytes"], readings: list[float]) -> None:
    """Each size's roofline from the run's highest bandwidth reading. The machine's free bandwidth
    moves while a run goes (a shared machine: the same server's time per token moved by a third
    from one request to the next), and one reading at the start put a decode median at 120% of its
    roofline: the bandwidth is read again after each server, and the highest reading bounds them all."""
    bandwidth = max(readings)
    result["bandwidth_gb_s"] = round(bandwidth / 1e9, 1)
    result["bandwidth_readings_gb_s"] = [round(r / 1e9, 1) for r in readings]
    for size, step in steps.items():
        result["sizes"][size]["roofline_tok_s"] = round(roofline.bound(bandwidth, step, CONTEXT), 1)
