"""python -m benchmarks paths [--sizes 1b] [--out DIR]: every C kernel path this CPU builds gives a
model's greedy tokens and top-5 log probabilities bit for bit, at the sizes people serve.

The golden file (tests/golden/cpu.json, testing/golden.py) holds every path to the same bits on
tiny models, in the tests; this checks the same at real sizes, where the products are wide enough
to take every branch of the tiled kernels, and the load repacks a GGUF's blocks (gguf_repack.c):
for each size's GGUF (the files `python -m benchmarks sizes` serves), an in-process engine on each
path (the machine's own, AVX-512 without VNNI, AVX2, plain C: `testing.golden.kernel_paths`) answers
the golden file's plain prompts together, greedy, 24 tokens with their top 5; every path's answers
must equal the machine's own. Writes DIR/results.json and prints a table; exits 1 on a difference.
"""
import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any, Optional

from contract import EngineConfig
from engine import AsyncEngine
from testing.golden import PROMPTS, build_paths, kernels, record

from .. import RESULTS
from ..harness.report import machine_info
from ..records.gguf_record import gguf_file
from ..records.sizes import SIZES, cpu_kind

KEYS = ("tokens", "logprobs", "top")


def answers(model: Path, prompts: list[str]) -> tuple[list[dict[str, Any]], float]:
    """The engine's answers on the kernels now in place (`kernels`), and the seconds they took."""
    engine = AsyncEngine(EngineConfig(model=str(model), device="cpu"))
    try:
        started = time.perf_counter()
        got = asyncio.run(record(engine, prompts, chat=False))
        return got, time.perf_counter() - started
    finally:
        engine.shutdown()


def first_difference(mine: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> Optional[str]:
    for a, b in zip(mine, theirs, strict=True):
        for key in KEYS:
            if a[key] != b[key]:
                return f"{a['prompt']!r}: {key}"
    return None


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks paths", description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1b", help=f"of {', '.join(SIZES)}")
    p.add_argument("--prompts", type=int, default=4, help="how many of the golden file's plain prompts")
    p.add_argument("--out", type=Path, default=RESULTS / "paths")
    args = p.parse_args(argv)
    libraries = build_paths()
    if not libraries:
        print("the C kernels are not built here: nothing to compare", file=sys.stderr)
        return 1
    prompts = PROMPTS[:args.prompts]
    result: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "git": machine_info().get("git"), "cpu": cpu_kind(),
                              "command": "python -m benchmarks paths " + " ".join(argv if argv is not None else sys.argv[1:]),
                              "paths": list(libraries), "sizes": {}}
    agree = True
    lines = ["| size | path | answers | seconds |", "|---|---|---|---|"]
    for size in args.sizes.split(","):
        model = gguf_file(SIZES[size])
        if not model.exists():
            print(f"{size}: {model.name} is not made (python -m benchmarks sized-models); skipped", flush=True)
            continue
        own: list[dict[str, Any]] = []
        entry: dict[str, Any] = {"file": model.name}
        for path, library in libraries.items():
            with kernels(library):
                got, seconds = answers(model, prompts)
            own = own or got
            difference = first_difference(got, own)
            agree = agree and difference is None
            entry[path] = {"seconds": round(seconds, 1), "same_as_native": difference is None, "difference": difference,
                           "tokens": sum(len(a["tokens"]) for a in got)}
            verdict = "the machine's own, bit for bit" if difference is None else f"DIFFER at {difference}"
            lines.append(f"| {size} | {path} | {verdict} | {seconds:.1f} |")
            print(lines[-1], flush=True)
        result["sizes"][size] = entry
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    print("\n" + "\n".join(lines))
    return 0 if agree else 1
