"""python -m benchmarks [serving]: every system, same models, same machine, same run.

See benchmarks/README.md. --quick finishes in a few minutes on a 2-core machine. The record modes
(--cpu-record, --prefix, ...) are subcommands too: `python -m benchmarks cpu-record` is
`python -m benchmarks --cpu-record`.
"""
import argparse
import asyncio
import importlib
import os
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Optional

from testing.procs import cpu_seconds, settle, stop_all

from .. import RESULTS
from ..harness.load import Transport, closed_loop, default_requests, make_prompts, poisson
from ..harness.metrics import cpu_per_token, summarize
from ..harness.models import DEFAULT_CACHE, MODELS, ensure_model
from ..harness.report import machine_info, ratios, write_all
from ..harness.systems import NAMED_ONLY, SYSTEMS, starters

# --quick: every system on the tiny model at C=1 and 16, plus this vs raw-engine on gpt2-small at
# C=1 and on the trained model at C=1 and 16
QUICK_EXTRAS = ({"model": "gpt2-small", "systems": ("this", "raw-engine"), "concurrency": (1,), "requests": 4},
                {"model": "smollm2", "systems": ("this", "raw-engine", "llama-cpp"), "concurrency": (1, 16),
                 "requests": None})


# Each mode's defaults, where the command line leaves a setting out (the first mode given wins):
# "systems" names the mode's module (in records/) and its tuple (imported only when the mode runs),
# "out" the folder under benchmarks/results.
MODE_DEFAULTS: dict[str, dict[str, Any]] = {
    "cpu_record": {"models": ["smollm2"], "concurrency": [1, 16], "systems": ("cpu_record", "RECORD_SYSTEMS"),
                   "num_requests": 32, "out": "cpu-record"},
    "gguf_record": {"concurrency": [1, 16], "systems": ("gguf_record", "GGUF_SYSTEMS"), "num_requests": 32,
                    "out": "gguf-record"},
    "speculation_sweep": {"models": ["smollm2", "gpt2-small"], "concurrency": [1, 4, 16, 64],
                          "out": "speculation-sweep"},
    "replicas": {"models": ["smollm2"], "out": "replicas"},
    "speculative": {"models": ["smollm2"], "concurrency": [1, 16], "systems": ("speculative", "SPEC_SYSTEMS"),
                    "num_requests": 32, "out": "speculative"},
    "prefix": {"models": ["smollm2"], "concurrency": [16], "systems": ("prefix", "PREFIX_SYSTEMS"),
               "out": "prefix"},
    "structured": {"models": ["smollm2"], "concurrency": [16]},
}


def _mode_default(key: str, value: Any) -> Any:
    if key == "systems":
        module, name = value
        return list(getattr(importlib.import_module(f".{module}", __package__), name))
    if key == "out":
        return RESULTS / value
    return value


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def _names(allowed: Optional[Sequence[str]]) -> Callable[[str], list[str]]:
    """A comma-separated list of names, each of `allowed` (None: checked later, by the mode)."""
    def parse(text: str) -> list[str]:
        names = [x for x in text.split(",") if x]
        bad = [x for x in names if allowed is not None and x not in allowed]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {bad}; choose from {', '.join(allowed)}")
        return names
    return parse


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks serving", description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=None,
                   help="where results.* go (default benchmarks/results/; --prefix: benchmarks/results/prefix/)")
    p.add_argument("--quick", action="store_true",
                   help="tiny model, C=1,16, fewer requests (plus this vs raw-engine on gpt2-small at C=1 "
                        "and on smollm2 at C=1,16)")
    p.add_argument("--models", type=_names(MODELS), default=None, help=f"of {','.join(MODELS)}")
    p.add_argument("--systems", type=_names(None), default=None,
                   help=f"of {','.join(SYSTEMS + NAMED_ONLY)} (default all but {','.join(NAMED_ONLY)}); "
                        "a mode with systems of its own takes its own names (--prefix: this,this-nocache,llama-cpp; "
                        "--cpu-record: this,this-engine,this-nospec,this-q4_0,llama-cpp-q4_1,llama-cpp-q4_0; "
                        "--gguf-record: this,llama-cpp)")
    p.add_argument("--concurrency", type=_ints, default=None, help="closed-loop levels (default 1,4,16,64)")
    p.add_argument("--rate", type=_floats, default=[], help="open-loop Poisson rates in requests/s")
    p.add_argument("--num-requests", type=int, default=None,
                   help="requests per level, at least C (default max(4C,16); quick: max(2C,8); Poisson: 32 x rate)")
    p.add_argument("--max-tokens", type=int, default=None, help="output tokens per request (default 64; quick 32)")
    p.add_argument("--time-limit", type=float, default=None,
                   help="per level: no new requests after this many seconds, cancel the rest at twice "
                        "(default 300; quick 40)")
    p.add_argument("--seed", type=int, default=0, help="prompt and arrival seed")
    p.add_argument("--static-batch-size", type=int, default=16, help="hf-static-batch's max batch")
    p.add_argument("--stream-interval", type=int, default=None,
                   help="this: tokens per streamed document (the request field; default: the server's, 1)")
    p.add_argument("--stream-interval-ms", type=int, default=None,
                   help="this: the server's stream_interval_ms (at least this long between a stream's documents)")
    p.add_argument("--models-dir", type=Path, default=DEFAULT_CACHE)
    p.add_argument("--structured", action="store_true",
                   help="the structured-output benchmark instead (records/structured.py): JSON-schema vs unconstrained "
                        "tok/s (default C=16, 48 requests per arm and round), TTFT of cached and new schemas, "
                        "compile times of a schema corpus; on smollm2 unless --models names another")
    p.add_argument("--rounds", type=int, default=3,
                   help="--structured, --speculation-sweep and --gguf-record: alternating rounds of the arms (of the "
                        "systems)")
    p.add_argument("--ttft-repeats", type=int, default=30, help="--structured: TTFT requests of each kind")
    p.add_argument("--prefix", action="store_true",
                   help="the prefix-caching benchmark instead (records/prefix.py): a resent conversation and "
                        "--concurrency (16) users sharing a system prompt, OpenAI streaming chat, this with the "
                        "cache on and off and llama-cpp; on smollm2 unless --models names another")
    p.add_argument("--turns", type=int, default=8, help="--prefix: user turns of the conversation")
    p.add_argument("--system-tokens", type=int, default=1000, help="--prefix: tokens of each system prompt")
    p.add_argument("--speculative", action="store_true",
                   help="the speculative-decoding benchmark instead (records/speculative.py): plain prompts at "
                        "--concurrency (1,16) and an input-copying chat workload at C=1, this with speculation "
                        "off and on (this-spec) and llama-cpp; on smollm2 unless --models names another")
    p.add_argument("--replicas", action="store_true",
                   help="the replicas benchmark instead (records/replicas.py): two replicas behind the router, "
                        "under round robin, and one replica: conversations, a shared prompt, a uniform load, a "
                        "killed replica and a rolling restart; on smollm2 unless --models names another")
    p.add_argument("--cpu-record", action="store_true",
                   help="the CPU record instead (records/cpu_record.py): this with its defaults, its engine alone, with "
                        "speculation off and on a Q4_0 GGUF, against llama.cpp on the Q4_1 and Q4_0 GGUF: plain prompts at "
                        "--concurrency (1,16), and cold prefill of about 1,300 tokens; on smollm2")
    p.add_argument("--gguf-record", action="store_true",
                   help="this against llama.cpp on the same GGUF file, Gemma 3 270M Q4_K_M (records/gguf_record.py): "
                        "plain prompts at --concurrency (1,16), and each server's time to ready")
    p.add_argument("--gguf-file", default="gemma",
                   help="--gguf-record's file: gemma (Gemma 3 270M Q4_K_M), smollm2-q4_1 (the default model's own "
                        "GGUF), smollm2-q4_0 (llama.cpp's Q4_0 of it) or a path")
    p.add_argument("--speculation-sweep", action="store_true",
                   help="speculation on against off (records/speculation_sweep.py): greedy and sampled, --concurrency "
                        "(1,4,16,64), on smollm2 and gpt2-small unless --models says otherwise")
    args = p.parse_args(argv)
    allowed: Sequence[str] = SYSTEMS + NAMED_ONLY
    for mode, defaults in MODE_DEFAULTS.items():
        if getattr(args, mode):
            resolved = {key: _mode_default(key, value) for key, value in defaults.items()}
            allowed = resolved.get("systems", allowed)
            for key, value in resolved.items():
                if not getattr(args, key):
                    setattr(args, key, value)
    try:  # the mode's own names, now that the mode is known
        _names(allowed)(",".join(args.systems or ()))
    except argparse.ArgumentTypeError as exc:
        p.error(f"argument --systems: {exc}")
    args.out = args.out or RESULTS
    args.systems = args.systems or list(SYSTEMS)
    args.quick_extra = args.quick and args.models is None
    args.models = args.models or (["tiny"] if args.quick else ["tiny", "gpt2-small", "smollm2"])
    args.concurrency = args.concurrency or ([1, 16] if args.quick else [1, 4, 16, 64])
    args.max_tokens = args.max_tokens or (32 if args.quick or args.prefix or args.replicas else 64)
    args.time_limit = args.time_limit or (40.0 if args.quick else 300.0)
    return args


def plan(args: argparse.Namespace) -> list[tuple[str, list[str], list[int], Optional[int]]]:
    """(model, systems, concurrency levels, requests override) in the order they run."""
    steps = [(m, args.systems, args.concurrency, args.num_requests) for m in args.models]
    for extra in QUICK_EXTRAS if args.quick_extra else ():
        systems = [s for s in extra["systems"] if s in args.systems]
        if systems:
            steps.append((extra["model"], systems, list(extra["concurrency"]),
                          args.num_requests or extra["requests"]))
    return steps


async def warm_up(send: Transport, prompts: list[str]) -> None:
    """Two short requests, untimed: connections, lazy initialisation, first-call costs."""
    for prompt in prompts[:2]:
        async for _ in send(prompt, 4):
            pass


async def measure(args, model: str, system: str, transport: str, send: Transport,
                  levels: list[int], n_override: Optional[int], rows: list[dict], position: int = 0) -> None:
    """Each load level of one transport. Its prompts are the same for every system, and differ
    between a system's transports (`position`: its first, second...): they share one server, whose
    prefix cache would otherwise serve the second transport's prompts without their prefill."""
    await warm_up(send, make_prompts(2, args.seed, draw="warm-up"))
    loads = [("closed", c) for c in levels] + [("poisson", r) for r in args.rate]
    for kind, value in loads:
        prompts = make_prompts(256, args.seed, draw=f"{kind} {value}" + (f" #{position}" if position else ""))
        cpu_before = cpu_seconds()
        if kind == "closed":
            n = max(default_requests(value, args.quick, n_override), value)  # at least C
            records, duration, cut = await closed_loop(send, prompts, value, n, args.max_tokens, args.time_limit)
        else:
            n = n_override or max(8, int(32 * value))
            records, duration, cut = await poisson(send, prompts, value, n, args.max_tokens,
                                                   args.time_limit, args.seed)
        row = {"system": system, "transport": transport, "model": model,
               "load": f"C={value}" if kind == "closed" else f"poisson {value}/s",
               "concurrency": value if kind == "closed" else None,
               "rate": value if kind == "poisson" else None, "max_tokens": args.max_tokens,
               **summarize(records, duration), "cut_short": cut,
               "loadavg_1m": round(os.getloadavg()[0], 2)}
        row["cpu_ms_per_token"] = cpu_per_token(cpu_before, cpu_seconds(), sum(r.tokens for r in records))
        rows.append(row)
        print(f"  {system}/{transport} {model} {row['load']}: {row['completed']}/{row['requests']} ok, "
              f"{row['output_tok_s']} tok/s, TTFT p50/p99 {row['ttft_p50_ms']}/{row['ttft_p99_ms']} ms, "
              f"TPOT p50 {row['tpot_p50_ms']} ms{' (cut short by the time limit)' if cut else ''}",
              flush=True)
        if any(r.error and "cancelled" in r.error for r in records):
            print(f"  {system}/{transport}: requests were abandoned; skipping its higher loads", flush=True)
            break


async def run(args: argparse.Namespace, rows: list[dict], notes: list[str]) -> None:
    logs = args.out / "logs"
    extra = {} if args.stream_interval is None else {"stream_interval": args.stream_interval}
    uses_with = {"stream_interval_ms": args.stream_interval_ms} if args.stream_interval_ms else None
    start = starters(args.static_batch_size, extra, uses_with)
    for model_name, systems, levels, n_override in plan(args):
        try:
            model = ensure_model(model_name, args.models_dir)
        except FileNotFoundError as exc:  # the trained model before `make model`
            notes.append(f"{model_name} skipped: {exc}")
            print(f"{model_name} skipped: {exc}", flush=True)
            continue
        for system in systems:
            print(f"{system} on {model_name}: starting", flush=True)
            t0 = time.perf_counter()
            try:
                async with start[system](model, logs, notes) as transports:
                    print(f"  ready in {time.perf_counter() - t0:.1f}s; transports {list(transports)}; "
                          f"quiet after {await settle():.1f}s more", flush=True)
                    for position, (transport, send) in enumerate(transports.items()):
                        try:
                            await measure(args, model_name, system, transport, send, levels, n_override, rows,
                                          position)
                        except Exception as exc:  # noqa: BLE001 - one broken transport skips itself
                            notes.append(f"{system}/{transport} on {model_name} failed: {str(exc)[:300]}")
                            print(f"  {system}/{transport} FAILED: {exc}", flush=True)
            except Exception as exc:  # noqa: BLE001 - a system that cannot start is a note, not a crash
                notes.append(f"{system} on {model_name} failed: {str(exc)[:500]}")
                print(f"  FAILED: {str(exc)[:2000]}", flush=True)


def _machine_checked() -> dict:
    """machine_info(), warning when the machine is already busy."""
    machine = machine_info()
    if machine["loadavg_at_start"][0] > 0.5 * machine["cpus_usable"]:
        print(f"warning: the machine is busy (load average {machine['loadavg_at_start']}): "
              "timings will be noisy; the benchmark assumes it has the machine to itself", flush=True)
    return machine


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    if args.structured:
        from .structured import main as run_structured
        return one_model_main(run_structured, args)
    if args.prefix:
        from .prefix import main as run_prefix
        return one_model_main(run_prefix, args, argv)
    if args.cpu_record:
        from .cpu_record import main as run_record
        return one_model_main(run_record, args, argv)
    if args.gguf_record:
        from .gguf_record import main as run_gguf
        try:
            from .gguf_record import gguf_file
            return run_gguf(args, _machine_checked(), argv, gguf_file(args.gguf_file))
        finally:
            stop_all()
    if args.speculation_sweep:
        from .speculation_sweep import main as run_sweep
        return run_sweep(args, machine_info(), argv)
    if args.speculative:
        from .speculative import main as run_speculative
        return one_model_main(run_speculative, args, argv)
    if args.replicas:
        from .replicas import main as run_replicas
        return one_model_main(run_replicas, args, argv)
    rows: list[dict] = []
    notes: list[str] = []
    machine = _machine_checked()
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "models_dir", "quick_extra")}
    t0 = time.perf_counter()
    interrupted = False
    try:
        asyncio.run(run(args, rows, notes))
    except KeyboardInterrupt:
        interrupted = True
        notes.append("interrupted: partial results")
    finally:
        stop_all()
        settings["wall_s"] = round(time.perf_counter() - t0, 1)
        write_all(args.out, rows, machine, notes, settings)
    print(f"\nwrote {args.out}/results.json, results.md, results.png in {settings['wall_s']}s")
    for note in notes:
        print("note:", note)
    print("\n".join(["", "Ratios (same run):"] + [f"  {r}" for r in ratios(rows)]))
    return 130 if interrupted else 0


def one_model_main(run: Callable[..., int], args: argparse.Namespace, *extra: Any) -> int:
    """--structured, --prefix and --speculative: on one model (the first of --models), with
    every server they started stopped however they end."""
    machine = _machine_checked()
    try:
        return run(args, ensure_model(args.models[0], args.models_dir), machine, *extra)
    finally:
        stop_all()

