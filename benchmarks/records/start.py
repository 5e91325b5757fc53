"""python -m benchmarks start: from the start command to the first answered completion, this
service (`make serve`) against llama.cpp's server on the same file.

Each round starts `python deploy/serve.py flows/llm.yml` (what `make serve` runs) with LLM_MODEL
set, and, on the same file, llama.cpp's server with the harness's arguments (2 threads, 16 slots,
16,384 tokens of context), one after the other, and times each from its start to the first
completion it answers (`/v1/completions`, 4 tokens, asked every 20 ms until it is answered). The
systems alternate, round by round, on a machine otherwise quiet. Models: the default one (its folder
here, llama.cpp on the GGUF it was made from; `default-gguf`: that GGUF here too), Gemma 3 270M
Q4_K_M (`make gemma`), and the random-weight 1.17B
Llama-shaped Q4_K_M of the sizes record (made on demand). The goal it checks: this service within
2x llama.cpp's time + 2 s. Writes RESULTS/results.json and prints a table.
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Optional

from testing.procs import free_port

from .. import HERE
from ..harness import sized_models
from ..harness.systems import LLAMA_SERVER, gguf_of
from .sizes import cpu_kind

PROG = "python -m benchmarks start"
ROOT = HERE.parent
DEFAULT = ROOT / "models" / "SmolLM2-135M-Instruct"
GEMMA = ROOT / "models" / "gemma-3-270m-q4_k_m.gguf"
POLL_S = 0.02
LIMIT_S = 300.0


def answered(port: int) -> bool:
    """Whether a 4-token completion on `port` is answered now."""
    body = json.dumps({"prompt": "Hello", "max_tokens": 4}).encode()
    try:
        with urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                                           {"Content-Type": "application/json"}), timeout=60) as r:
            return r.status == 200 and bool(r.read())
    except OSError:
        return False


def timed_start(command: list[str], port: int, env: dict[str, str], log: Path) -> float:
    """Seconds from `command`'s start to its first answered completion; it is then stopped whole."""
    started = time.monotonic()
    with open(log, "wb") as out:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    try:
        while not answered(port):
            if process.poll() is not None or time.monotonic() - started > LIMIT_S:
                raise RuntimeError(f"{command[:3]} answered nothing; its log: {log}")
            time.sleep(POLL_S)
        return time.monotonic() - started
    finally:
        os.killpg(process.pid, signal.SIGINT)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def this_service(model: Path, log: Path) -> float:
    port = free_port()
    env = {**os.environ, "LLM_MODEL": str(model), "LLM_GRPC_PORT": str(free_port()), "LLM_HTTP_PORT": str(port)}
    return timed_start([sys.executable, "deploy/serve.py", "flows/llm.yml"], port, env, log)


def llama_cpp(gguf: Path, log: Path) -> float:
    port = free_port()
    env = {**os.environ, "LD_LIBRARY_PATH": str(LLAMA_SERVER.parent)}
    return timed_start([str(LLAMA_SERVER), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
                        "--parallel", "16", "--threads", "2", "--ctx-size", "16384", "--cont-batching"], port, env, log)


def models(names: list[str]) -> dict[str, tuple[Path, Path]]:
    """name -> (what this service serves, the GGUF llama.cpp serves)."""
    found: dict[str, tuple[Path, Path]] = {}
    for name in names:
        if name == "default":  # its folder, as `make serve` serves it
            found[name] = (DEFAULT, gguf_of(DEFAULT))
        elif name == "default-gguf":  # the Q4_1 GGUF it was made from, llama.cpp's file, served here too
            found[name] = (gguf_of(DEFAULT), gguf_of(DEFAULT))
        elif name == "gemma":
            found[name] = (GEMMA, GEMMA)
        else:
            file = sized_models.gguf(name, "Q4_K_M")
            found[name] = (file, file)
    return found


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--models", default="default,default-gguf,gemma,llama-1b",
                   help="default (its folder), default-gguf (its Q4_1 file), gemma, or a sized model's name")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--pause", type=float, default=3.0, help="seconds between two starts")
    p.add_argument("--results", type=Path, default=HERE / "results" / "start")
    args = p.parse_args(argv)
    args.results.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    result: dict = {"date": time.strftime("%Y-%m-%d"), "commit": commit, "machine": cpu_kind(),
                    "rounds": args.rounds, "models": {}}
    for name, (served, gguf) in models(args.models.split(",")).items():
        times: dict[str, list[float]] = {"this": [], "llama.cpp": []}
        for round_ in range(args.rounds):
            for system in times:
                log = args.results / f"{name}-{system}.log"
                took = this_service(served, log) if system == "this" else llama_cpp(gguf, log)
                times[system].append(round(took, 2))
                print(f"{name}, round {round_ + 1}, {system}: {times[system][-1]:.2f} s", flush=True)
                time.sleep(args.pause)
        this, llama = statistics.median(times["this"]), statistics.median(times["llama.cpp"])
        result["models"][name] = {"file": gguf.name, "this_s": times["this"], "llama_cpp_s": times["llama.cpp"],
                                  "this_median_s": this, "llama_cpp_median_s": llama, "goal_s": round(2 * llama + 2, 2)}
    (args.results / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    print("\n| model | this (median, range) | llama.cpp | goal: 2x llama.cpp + 2 s |\n|---|---|---|---|")
    for name, m in result["models"].items():
        met = "met" if m["this_median_s"] <= m["goal_s"] else "not met"
        print(f"| {name} ({m['file']}) | {m['this_median_s']:.2f} s ({min(m['this_s']):.2f} to {max(m['this_s']):.2f}) "
              f"| {m['llama_cpp_median_s']:.2f} s | {m['goal_s']:.2f} s: {met} |")
    return 0
