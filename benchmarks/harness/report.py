"""results.json, results.md, results.png, and the ratios the project's goals are stated in."""
import asyncio
import itertools
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, Optional

from testing.procs import ROOT, stop_all

TABLE = [("system", "system"), ("transport", "transport"), ("model", "model"), ("load", "load"),
         ("ok/n", None), ("TTFT p50", "ttft_p50_ms"), ("TTFT p99", "ttft_p99_ms"),
         ("TPOT p50", "tpot_p50_ms"), ("TPOT p99", "tpot_p99_ms"), ("ITL p50", "itl_p50_ms"),
         ("ITL p99", "itl_p99_ms"), ("E2E p50", "e2e_p50_ms"), ("E2E p99", "e2e_p99_ms"),
         ("req/s", "req_s"), ("out tok/s", "output_tok_s"), ("tok/doc", "tokens_per_document"),
         ("CPU ms/token", "cpu_ms_per_token")]


def machine_info() -> dict:
    import torch
    import transformers
    cuda = torch.cuda.is_available()
    return {
        "cpu_count": os.cpu_count(), "cpus_usable": len(os.sched_getaffinity(0)),
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
        "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
        "transformers": transformers.__version__, "python": sys.version.split()[0],
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "platform": platform.platform(), "git": _git(), "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def write_results(out: Path, text: str, result: Optional[dict] = None) -> None:
    """A benchmark's table (results.md, also printed) and, where given, its figures (results.json)
    into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    if result is not None:
        (out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "results.md").write_text(text)
    print(text)


def _git() -> Optional[str]:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True,
                               text=True).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return None


def run_record(argv: Optional[list[str]], machine: dict, **fields: Any) -> dict[str, Any]:
    """The head of a run's results.json (when, which commit, the exact command, the machine),
    then `fields`."""
    argv = sys.argv[1:] if argv is None else argv
    return {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "git": _git(),
            "command": "python -m benchmarks " + shlex.join(argv), "machine": machine, **fields}


def run_and_write(measure: Coroutine[Any, Any, None], result: dict, out: Path,
                  markdown: Callable[[dict], str]) -> tuple[int, str]:
    """Runs `measure`, which fills `result`: to its end, or to an interrupt that keeps the partial
    results (exit code 130). Then every server stops, `settings.wall_s` gets the run's time, and
    results.json and results.md are written. Returns (exit code, the markdown)."""
    t0 = time.perf_counter()
    code = 0
    try:
        asyncio.run(measure)
    except KeyboardInterrupt:
        result["notes"].append("interrupted: partial results")
        code = 130
    finally:
        stop_all()
        result["settings"]["wall_s"] = round(time.perf_counter() - t0, 1)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(result, indent=1))
        text = markdown(result)
        (out / "results.md").write_text(text)
    return code, text


async def measure_each(names: list[str], measure_one: Callable[[str], Coroutine[Any, Any, None]],
                       notes: list[str]) -> None:
    """`measure_one` for each name in turn; one that cannot run becomes a note, not a crash."""
    for name in names:
        try:
            await measure_one(name)
        except Exception as exc:  # noqa: BLE001
            notes.append(f"{name} failed: {str(exc)[:500]}")
            print(f"  {name} FAILED: {str(exc)[:2000]}", flush=True)


def figure(result: dict, key: str = "output_tok_s", **match: Any) -> Optional[float]:
    """The `key` of the row whose fields equal `match`; None where there is no such row or one of
    its requests failed (a level cut short has no figure)."""
    for row in result["rows"]:
        if all(row.get(k) == v for k, v in match.items()):
            return row[key] if row["completed"] == row["requests"] else None
    return None


def goal_line(label: str, num: Optional[float], den: Optional[float], goal: float, unit: str = "tok/s",
              fmt: str = "g") -> str:
    """`label: num / den unit = ratio (goal >= g: met)`, or n/a where a figure is missing."""
    if not num or not den:
        return f"{label}: n/a"
    return f"{label}: {num:{fmt}} / {den:{fmt}} {unit} = {num / den:.2f}x (goal >= {goal:g}: " \
           f"{'met' if num / den >= goal else 'NOT met'})"


def workload_table(result: dict) -> list[str]:
    """The records' table of workload rows (metrics.workload_row's), one line each."""
    lines = ["| system | workload | C | output tok/s | TTFT p50 (ms) | TPOT p50 (ms) | ITL p50 (ms) | ok |",
             "|---|---|---|---|---|---|---|---|"]
    return lines + [f"| {r['system']} | {r['workload']} | {r['concurrency']} | {r['output_tok_s']} | "
                    f"{r['ttft_p50_ms']} | {r['tpot_p50_ms']} | {r['itl_p50_ms']} | {r['completed']}/{r['requests']} |"
                    for r in result["rows"]]


def label(row: dict) -> str:
    return f"{row['system']}/{row['transport']}"


def write_all(out: Path, rows: list[dict], machine: dict, notes: list[str], settings: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(
        {"rows": rows, "machine": machine, "settings": settings, "notes": notes}, indent=1))
    (out / "results.md").write_text(markdown(rows, machine, notes, settings))
    if rows:
        plot(rows, out / "results.png")


def _cell(row: dict, key: Optional[str]) -> str:
    if key is None:
        return f"{row['completed']}/{row['requests']}" + (" cut" if row.get("cut_short") else "")
    value = row.get(key)
    if isinstance(value, dict):  # CPU by role
        return ", ".join(f"{role} {ms}" for role, ms in value.items())
    return "-" if value is None else str(value)


def markdown(rows: list[dict], machine: dict, notes: list[str], settings: dict) -> str:
    lines = ["# Serving benchmark", "",
             f"Machine: {machine['cpu_count']} CPUs, device {machine['device']}, torch {machine['torch']}, "
             f"git {machine['git']}, {machine['time']}. Load average at start: {machine['loadavg_at_start']}.",
             f"Settings: {json.dumps(settings)}", "",
             "Times in ms; `load` is the closed-loop concurrency C or the Poisson rate; `tok/doc` "
             "is output tokens per streamed document (above 1: the reader fell behind and got "
             "coalesced documents, each counted once in ITL). `CPU ms/token`: CPU time per output token "
             "of each process by role (client: the load generator; engine: the engine process).", ""]
    lines.append("| " + " | ".join(h for h, _ in TABLE) + " |")
    lines.append("|" + "---|" * len(TABLE))
    for row in rows:
        lines.append("| " + " | ".join(_cell(row, k) for _, k in TABLE) + " |")
    lines += ["", "## Ratios", ""] + [f"- {r}" for r in ratios(rows)]
    if notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    """Output tok/s and TTFT p99 against concurrency, one line per system/transport, a pair per model."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    closed = [r for r in rows if r["concurrency"] is not None]
    models = list(dict.fromkeys(r["model"] for r in closed)) or ["(none)"]
    fig, axes = plt.subplots(len(models), 2, figsize=(12, 4.2 * len(models)), squeeze=False)
    for (ax_tok, ax_ttft), model in zip(axes, models, strict=True):
        for name in dict.fromkeys(label(r) for r in closed if r["model"] == model):
            line = sorted((r for r in closed if r["model"] == model and label(r) == name),
                          key=lambda r: r["concurrency"])
            xs = [r["concurrency"] for r in line]
            ax_tok.plot(xs, [r["output_tok_s"] or 0 for r in line], marker="o", label=name)
            ax_ttft.plot(xs, [r["ttft_p99_ms"] or float("nan") for r in line], marker="o", label=name)
        for ax, title in ((ax_tok, "output tokens/s"), (ax_ttft, "TTFT p99 (ms)")):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("concurrency (closed loop)")
            ax.set_title(f"{model}: {title}")
            ax.grid(True, alpha=0.3)
        ax_ttft.set_yscale("log")
        ax_tok.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _find(rows: list[dict], system: str, model: str, concurrency: int,
          transport: Optional[str] = None) -> Optional[dict]:
    for r in rows:
        if (r["system"], r["model"], r["concurrency"]) == (system, model, concurrency) and \
                (transport is None or r["transport"] == transport) and r["completed"]:
            return r
    return None


def _ratio(a: Optional[float], b: Optional[float]) -> str:
    return f"{a / b:.2f}x" if a and b else "n/a"


def ratios(rows: list[dict]) -> list[str]:
    """The same-run comparisons the project's goals are stated in."""
    out = []
    models = list(dict.fromkeys(r["model"] for r in rows))
    this_transports = list(dict.fromkeys(r["transport"] for r in rows if r["system"] == "this"))
    for model in models:
        for level, peer, mine in itertools.product((1, 16), ("raw-engine", "llama-cpp"), ("this", "this-thread")):
            other = _find(rows, peer, model, level)
            for t in this_transports:
                this = _find(rows, mine, model, level, t)
                if this and other:
                    out.append(f"{model}, C={level}: {mine}/{t} / {peer} output tok/s = "
                               f"{_ratio(this['output_tok_s'], other['output_tok_s'])} "
                               f"({this['output_tok_s']} vs {other['output_tok_s']}); TTFT p50 "
                               f"{this['ttft_p50_ms']} vs {other['ttft_p50_ms']} ms")
        for peer in ("seed-jina", "hf-streamer", "hf-static-batch"):
            other = _find(rows, peer, model, 16)
            for t in this_transports:
                this = _find(rows, "this", model, 16, t)
                if this and other:
                    out.append(f"{model}, C=16: this/{t} / {peer} output tok/s = "
                               f"{_ratio(this['output_tok_s'], other['output_tok_s'])} "
                               f"({this['output_tok_s']} vs {other['output_tok_s']}); TTFT p99 "
                               f"{this['ttft_p99_ms']} vs {other['ttft_p99_ms']} ms "
                               f"({_ratio(other['ttft_p99_ms'], this['ttft_p99_ms'])} lower)")
    return out or ["(no pair of rows to compare)"]
