"""python -m benchmarks commit-ab: two commits' engines, alone, side by side in one run.

    python -m benchmarks commit-ab --base f2817d0 [--head HEAD] [--rounds 5] [--concurrency 1,16]
    python -m benchmarks commit-ab --base f2817d0 --workload rows [--rounds 1]
    python -m benchmarks commit-ab --base f2817d0 --workload prefill
    python -m benchmarks commit-ab --base f2817d0 --dtype fp32

Each commit is checked out into a temporary git worktree. Rounds alternate between them, each in
a fresh process that imports that commit's engine (`AsyncEngine.generate`, which every version
has) with the default EngineConfig (or `--dtype`), and warms up. Workloads:

- `decode` (the default): greedy streams of `--tokens` tokens (`ignore_eos`) at each level of
  `--concurrency`: output tok/s, all streams' tokens over the wall time from the first request
  to the last token. A noisy machine hurts both commits alike; medians over `--rounds`.
- `prefill`: three prompts of about 1,300 tokens, each new to the engine, one at a time, one
  token each: prompt tokens over the median time to that token (`prefill_tok_s`).
- `rows`: one request with a 4,000-token prompt (256 tokens) and, once it decodes, 31 short ones
  (64 tokens each): the most rows that decode together while it does (the engine's stats, polled
  every millisecond).
"""
import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROG = "python -m benchmarks commit-ab"

# runs inside the worktree's interpreter, against the worktree's code
PROBE = r"""
import asyncio, json, sys, time
from contract import EngineConfig, SamplingParams
try:  # the engine's package before it moved to the top level (an editable install may also see the other)
    from executors.engine import AsyncEngine
except ImportError:
    from engine import AsyncEngine
model, tokens, levels, workload = sys.argv[1], int(sys.argv[2]), [int(c) for c in sys.argv[3].split(",")], sys.argv[4]
dtype = sys.argv[5]
WORDS = "the river runs past the old mill where children play and the baker sells bread at dawn".split()

async def stream(engine, i):
    prompt = f"Story {i}: " + " ".join(WORDS[(i + k) % len(WORDS)] for k in range(24))
    n = 0
    async for out in engine.generate(prompt, SamplingParams(max_tokens=tokens, ignore_eos=True)):
        n += len(out.token_ids)
    return n

async def decode(engine):
    result = {}
    for c in levels:
        t0 = time.perf_counter()
        done = sum(await asyncio.gather(*(stream(engine, i) for i in range(c))))
        result[f"C={c}"] = done / (time.perf_counter() - t0)
    return result

async def rows(engine):
    long_prompt = " ".join(WORDS[k % len(WORDS)] for k in range(3990))
    started = asyncio.Event()
    async def one(prompt, tokens):
        n = 0
        async for out in engine.generate(prompt, SamplingParams(max_tokens=tokens, ignore_eos=True)):
            n += len(out.token_ids)
            started.set()
        return n
    long = asyncio.ensure_future(one(long_prompt, 256))
    await started.wait()  # the long request decodes: the short ones join it
    short = [asyncio.ensure_future(one(f"Hi {i}", 64)) for i in range(31)]
    most = 0
    while not long.done():
        s = engine.stats()  # rows in the decode batch: an older engine's batch_rows, else running - prefilling
        most = max(most, s["batch_rows"] if "batch_rows" in s else s["running"] - s["prefilling"])
        await asyncio.sleep(0.001)
    assert long.result() == 256 and all(n == 64 for n in await asyncio.gather(*short))
    return {"prompt_tokens": len(engine.tokenizer(long_prompt)["input_ids"]), "most_rows_beside_it": most}

async def prefill(engine):
    times = []
    for i in range(3):  # each prompt new to the engine: its first words differ
        prompt = f"Document {i} of the round: " + " ".join(WORDS[(i + k) % len(WORDS)] for k in range(1200))
        t0 = time.perf_counter()
        async for _ in engine.generate(prompt, SamplingParams(max_tokens=1)):
            pass
        times.append(time.perf_counter() - t0)
    tokens = len(engine.tokenizer(prompt)["input_ids"])
    return {"prompt_tokens": tokens, "prefill_tok_s": tokens / sorted(times)[1]}

async def main():
    engine = AsyncEngine(EngineConfig(model=model, dtype=dtype))
    try:
        await stream(engine, 999)
        run = {"rows": rows, "prefill": prefill}.get(workload, decode)
        print(json.dumps(await run(engine)))
    finally:
        engine.shutdown()
asyncio.run(main())
"""


def worktree(rev: str, into: Path) -> Path:
    path = into / rev.replace("/", "_")
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), rev], check=True,
                   capture_output=True)
    return path


def one_round(tree: Path, args: argparse.Namespace) -> dict[str, float]:
    done = subprocess.run([sys.executable, "-c", PROBE, str(args.model), str(args.tokens),
                           ",".join(map(str, args.concurrency)), args.workload, args.dtype], cwd=tree, capture_output=True, text=True,
                          check=False, env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"}, timeout=1800)
    if done.returncode:
        raise RuntimeError(f"{tree.name}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--base", required=True, help="the commit to compare against")
    p.add_argument("--head", default="HEAD")
    p.add_argument("--model", type=Path, default=ROOT / "models" / "SmolLM2-135M-Instruct")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 16])
    p.add_argument("--workload", choices=["decode", "prefill", "rows"], default="decode")
    p.add_argument("--dtype", default="auto", help="EngineConfig.dtype (auto: the service's default)")
    p.add_argument("--out", type=Path, default=None, help="also write results.json here")
    args = p.parse_args(argv)
    args.model = args.model.resolve()
    revs = {name: subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", rev], capture_output=True,
                                 text=True, check=True).stdout.strip() for name, rev in (("base", args.base),
                                                                                         ("head", args.head))}
    samples: dict[str, list[dict[str, float]]] = {"base": [], "head": []}
    with tempfile.TemporaryDirectory(prefix="commit-ab-") as tmp:
        trees = {name: worktree(rev, Path(tmp)) for name, rev in revs.items()}
        try:
            for r in range(args.rounds):
                for name in (("base", "head") if r % 2 == 0 else ("head", "base")):
                    samples[name].append(one_round(trees[name], args))
                    print(f"round {r + 1} {name} ({revs[name]}): {samples[name][-1]}", flush=True)
        finally:
            for tree in trees.values():
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)
    medians = {name: {level: statistics.median(s[level] for s in runs) for level in runs[0]}
               for name, runs in samples.items()}
    result = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "revs": revs, "model": args.model.name,
              "workload": args.workload,
              "tokens": args.tokens, "rounds": args.rounds, "command": f"{PROG} "
              + " ".join(argv if argv is not None else sys.argv[1:]), "samples": samples, "median_tok_s": medians,
              "head_over_base": {level: medians["head"][level] / medians["base"][level] for level in medians["base"]}}
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(result, indent=1))
    print(json.dumps({k: result[k] for k in ("revs", "median_tok_s", "head_over_base")}, indent=1))
    return 0
