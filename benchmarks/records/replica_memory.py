"""python -m benchmarks replica-memory: what a second replica of one model costs in memory, with the
weights shared between replicas (`LLM_SHARE_WEIGHTS=on`, as `auto` does for `LLM_REPLICAS` over 1)
and without (`off`).

    python -m benchmarks replica-memory [--model FILE] [--out DIR]

First as `LLM_REPLICAS=1 make serve` and `LLM_REPLICAS=2 make serve` run it (testing/flows.py:
one Flow, its embedder too, `LLM_SHARE_WEIGHTS` left at `auto`, which shares where there are
replicas). Then each case is a fresh fleet on this machine (testing/fleet.py: `jina executor` replicas and one
`jina gateway`, as the replicas records run them) serving `--model` (default: the 1.17B
Llama-shaped Q4_K_M file that `python -m benchmarks sized-models llama-1b --quant Q4_K_M`
makes). Once every replica is routable and has answered a streamed completion, the proportional
set size (PSS: a page that n processes map counts 1/n in each) of every process of the fleet,
children included, is summed. Shared weights are written to a fresh cache folder per case, so the
first replica of each case writes the file and the second maps it.
"""
import argparse
import json
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Optional

import psutil

from testing.fleet import LocalFleet
from testing.flows import start_flow
from testing.procs import ROOT

from ..harness.report import write_results
from ..harness.sized_models import CACHE
from .sizes import head

CASES = (("shared", 1), ("shared", 2), ("off", 1), ("off", 2))


def tree_pss(roots: list[int]) -> int:
    """Bytes: the PSS of these processes and all their children."""
    processes = {pid: psutil.Process(pid) for pid in roots}
    for pid in roots:
        processes.update({child.pid: child for child in psutil.Process(pid).children(recursive=True)})
    total = 0
    for process in processes.values():
        try:
            total += process.memory_full_info().pss
        except psutil.Error:
            pass
    return total


def complete(port: int) -> None:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=30) as answer:
        model = json.load(answer)["data"][0]["id"]
    body = {"model": model, "prompt": "One replica or two", "max_tokens": 8, "stream": True}
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as answer:
        answer.read()


def wait_loaded(port: int, replicas: int, timeout: float = 300.0) -> None:
    """Until the gateway's /stats has `replicas` replicas, each with its model loaded."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=30) as answer:
            states = [r.get("model_state") for r in json.load(answer)["replicas"]]
        if states.count("loaded") >= replicas:
            return
        time.sleep(0.5)
    raise TimeoutError(f"{replicas} replicas did not load their model in {timeout:.0f} s")


def settled(http_port: int, roots: list[int], sharing: str, replicas: int, ready: float) -> dict[str, Any]:
    """The row of a started case: every replica has answered (two completions each, on average), then
    the PSS of `roots` and their children."""
    for _ in range(2 * replicas):
        complete(http_port)
    time.sleep(2)
    row = {"sharing": sharing, "replicas": replicas, "pss_gb": round(tree_pss(roots) / 1e9, 2),
           "ready_s": round(ready, 1)}
    print(f"  {row}", flush=True)
    return row


def measure_flow(model: Path, replicas: int, logs: Path) -> dict[str, Any]:
    """`LLM_REPLICAS=n make serve`'s Flow: the Flow's process, its gateway, each replica's executor and
    engine process, and the embedder."""
    with tempfile.TemporaryDirectory(dir=ROOT / "benchmarks" / ".models") as cache:
        env = {"LLM_REPLICAS": str(replicas), "LLM_SHARE_WEIGHTS": "auto", "LLM_WEIGHTS_CACHE": cache}
        started = time.perf_counter()
        folder = logs / f"flow-{replicas}"
        folder.mkdir(parents=True, exist_ok=True)
        server, _, http_port = start_flow(str(model), folder, env=env, embeddings=True)
        try:
            wait_loaded(http_port, replicas)  # the Flow answers once one replica has its model
            return settled(http_port, [server.proc.pid], "flow", replicas, time.perf_counter() - started)
        finally:
            server.stop()


def measure(model: Path, sharing: str, replicas: int, logs: Path) -> dict[str, Any]:
    """A fleet: one `jina gateway`, and a `jina executor` per replica."""
    with tempfile.TemporaryDirectory(dir=ROOT / "benchmarks" / ".models") as cache:
        env = {"LLM_SHARE_WEIGHTS": "off" if sharing == "off" else "on", "LLM_WEIGHTS_CACHE": cache}
        started = time.perf_counter()
        with LocalFleet(str(model), logs, replicas, env) as fleet:
            roots = [p.proc.pid for p in (fleet.gateway, *fleet.executors) if p is not None]
            return settled(fleet.http_port, roots, sharing, replicas, time.perf_counter() - started)


LABELS = {"flow": "`LLM_REPLICAS=n make serve`: one Flow (auto: shared with 2)",
          "auto": "a fleet as served by default (auto: one private, two shared)",
          "shared": "a fleet, shared (LLM_SHARE_WEIGHTS=on)", "off": "a fleet, each its own (off)"}


def table(result: dict) -> str:
    rows = {(r["sharing"], r["replicas"]): r["pss_gb"] for r in result["rows"]}
    rows[("auto", 1)], rows[("auto", 2)] = rows.get(("off", 1)), rows.get(("shared", 2))
    lines = [f"# Two replicas of one model: memory ({result['cpu']})", "",
             f"{result['date']}, git {result['git']}, `{result['command']}`, {result['model']}. PSS of every "
             "process: the Flow's (its gateway, each replica's executor and engine process, the embedder), or "
             "the fleet's (`jina executor` replicas and one `jina gateway`, as compose runs them), GB.", "",
             "| served as | one replica | two replicas | two / one |", "|---|---|---|---|"]
    for sharing, label in LABELS.items():
        one, two = rows.get((sharing, 1)), rows.get((sharing, 2))
        ratio = f"**{two / one:.2f}x**" if one and two else "n/a"
        lines.append(f"| {label} | {one} | {two} | {ratio} |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks replica-memory", description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=CACHE / "llama-1b-Q4_K_M.gguf")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "replica-memory")
    args = p.parse_args(argv)
    if not args.model.exists():
        p.error(f"{args.model} is not there: `python -m benchmarks sized-models llama-1b --quant Q4_K_M` makes it")
    (args.out / "logs").mkdir(parents=True, exist_ok=True)
    result = head("replica-memory", argv, model=args.model.name, rows=[])
    for replicas in (1, 2):
        result["rows"].append(measure_flow(args.model, replicas, args.out / "logs"))
    for sharing, replicas in CASES:
        result["rows"].append(measure(args.model, sharing, replicas, args.out / "logs"))
    write_results(args.out, table(result), result)
    return 0
