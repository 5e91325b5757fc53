"""python -m benchmarks kernel-ab: two commits' C kernels in one process, the same inputs, side by side.

    python -m benchmarks kernel-ab --base ca2a07e [--head HEAD] [--repeats 15] [--out DIR]
    python -m benchmarks kernel-ab --base HEAD --base-flags=-mno-avx512f --head-flags=-mno-avx512bf16
    python -m benchmarks kernel-ab --base ca2a07e --case "Gemma's shape" [--case ...]

Each commit's engine/kernels sources (`git show`) are compiled as the engine compiles them
(build.py's flags) into a library of their own; both are loaded here and called on the same inputs,
bound from today's kernels.h (so the functions timed must keep their signatures between the two).
`--base-flags` and `--head-flags` go after build.py's flags: one commit built for two narrower
CPUs (above: the AVX2 versions against the AVX512-VNNI ones, as a CPU without BF16 builds them).
Every output is checked bit for bit against the other commit's, and the calls alternate, the
median of `--repeats` each. `--case` runs only the cases whose names contain one of its texts
(the Gemma output layer's inputs alone take seconds to make). Cases, on the default model's
shapes (SmolLM2-135M: hidden 576, 9 heads, 3 kv heads of 64, 1,536 MLP, 49,152 outputs):
- int4 matmul: one layer's four calls (q+k+v, o, gate+up, down) at 1, 16 and 512 rows, and Q4_K's
  form in the 1.17B's 16 layers (0.54 GB, streamed from memory) at 1 and 16 rows, and in one 2048 x
  8192 weight the caches hold at 1, 2 and 16 rows;
- int8 output layer (Q8_0) at 1 and 16 rows, Gemma 3 270M's gate and up (Q5_0, int8's form) at 1,
  16 and 512 rows, and its output layer at 16 rows;
- attention: a decode step of 16 sequences of 300 to 600 keys, and a 1,286-token prompt as the
  engine runs it, in chunks of 512 tokens; a decode step and eight 70-token prompts in Gemma 3
  270M's shape (4 heads sharing 1 kv head of 256); the decode step and the prompt in Qwen 2.5
  1.5B's (12 heads sharing 2 kv heads of 128);
- greedy rows (each row's token and log probability) over Gemma 3 270M's 262,144 logits, 1 and 16 rows.
"""
import argparse
import ctypes
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

from engine.kernels import build

from ..harness.report import machine_info

PROG = "python -m benchmarks kernel-ab"

HIDDEN, HEADS, KV_HEADS, DIM, INTER, VOCAB, BLOCK = 576, 9, 3, 64, 1536, 49152, 16
GEMMA_HEADS = (4, 1, 256)  # Gemma 3 270M's attention: heads, kv heads, head dim
QWEN_HEADS = (12, 2, 128)  # Qwen 2.5 1.5B's: six heads share each kv head
GEMMA_GATE_UP = (640, 2 * 2048)  # Gemma 3 270M's gate and up (Q5_0 in its Q4_K_M file): inputs, outputs
GEMMA_OUTPUT = (640, 262144)  # and its output layer (Q8_0)
LAYER = [(HIDDEN, (HEADS + 2 * KV_HEADS) * DIM), (HIDDEN, HIDDEN), (HIDDEN, 2 * INTER), (INTER, HIDDEN)]
Case = Callable[[ctypes.CDLL], list[torch.Tensor]]  # one library's outputs for the case's inputs


def compile_rev(rev: str, folder: Path, flags: tuple[str, ...] = ()) -> ctypes.CDLL:
    """The kernels of `rev`, compiled as the engine compiles them (then `flags`) into a library of
    their own (in `folder`) and bound from kernels.h."""
    folder.mkdir()
    names = subprocess.run(["git", "-C", str(build.HERE), "ls-tree", "--name-only", rev, "."], capture_output=True,
                           text=True, check=True).stdout.split()
    sources = []
    for name in (n for n in names if n.endswith((".c", ".h"))):
        text = subprocess.run(["git", "-C", str(build.HERE), "show", f"{rev}:./{name}"], capture_output=True,
                              text=True, check=True).stdout
        (folder / name).write_text(text)
        sources += [folder / name] if name.endswith(".c") else []
    build.compile_into(build.find_compiler(), folder / "kernels.so", tuple(sources), flags)
    return build.bind(ctypes.CDLL(str(folder / "kernels.so")), missing_ok=True, path=folder / "kernels.h")


def int4_case(rows: int) -> Case:
    g = torch.Generator().manual_seed(rows)
    weights = [(torch.randint(0, 256, (n // 16, k // 32, 16, 16), dtype=torch.uint8, generator=g),
                (torch.rand(n // 16, k // 32, 16, generator=g) / 100).half(),
                (-torch.rand(n // 16, k // 32, 16, generator=g) / 10).half(), k, n) for k, n in LAYER]
    xs = [torch.randn(rows, k, generator=g) for k, _ in LAYER]

    def run(lib: ctypes.CDLL) -> list[torch.Tensor]:
        ys = []
        for x, (packed, scale, low, k, n) in zip(xs, weights, strict=True):
            ys.append(torch.empty(rows, n))
            assert lib.int4_matmul(x.data_ptr(), packed.data_ptr(), scale.data_ptr(), low.data_ptr(),
                                   ys[-1].data_ptr(), rows, k, n, torch.get_num_threads()) == 0
        return ys
    return run


def int4k_model_case(rows: int, layers: int = 16) -> Case:
    """Q4_K's form (int4k: its own 6-bit scales) in the 1.17B's layers (hidden 2048, MLP 8192, q and k
    of 2048 and 512, v left out as its Q6_K is), all 16: 0.54 GB of weights, which stream from
    memory as a decode step reads them; `layers` 0: one 2048 x 8192 weight, which the caches hold."""
    g = torch.Generator().manual_seed(rows)
    shapes = [(2048, 2048 + 512), (2048, 2048), (2048, 2 * 8192), (8192, 2048)] * layers or [(2048, 8192)]
    weights = [(torch.randint(0, 256, (n // 16, k // 32, 16, 16), dtype=torch.uint8, generator=g),
                (torch.rand(n // 16, k // 256, 2, 16, generator=g) / 100).half(),
                torch.randint(0, 64, (n // 16, k // 32, 2, 16), dtype=torch.uint8, generator=g), k, n)
               for k, n in shapes]
    xs = {k: torch.randn(rows, k, generator=g) for k, _ in shapes}

    def run(lib: ctypes.CDLL) -> list[torch.Tensor]:
        ys = []
        for packed, super_, sub, k, n in weights:
            ys.append(torch.empty(rows, n))
            assert lib.int4k_matmul(xs[k].data_ptr(), packed.data_ptr(), super_.data_ptr(), sub.data_ptr(),
                                    ys[-1].data_ptr(), rows, k, n, torch.get_num_threads()) == 0
        return ys[-4:]  # the last layer's (each layer's inputs are the same)
    return run


def int8_case(rows: int, width: int = HIDDEN, outputs: int = VOCAB) -> Case:
    g = torch.Generator().manual_seed(rows)
    packed = torch.randint(-127, 128, (outputs // 16, width, 16), dtype=torch.int8, generator=g)
    # Q8_0's fp16 scale per block of 32 inputs (a base before the Q8_0 output layer took one fp32
    # scale per output: its int8 case is not comparable)
    scale = (torch.rand(outputs // 16, width // 32, 16, generator=g) / 100).half()
    x = torch.randn(rows, width, generator=g)

    def run(lib: ctypes.CDLL) -> list[torch.Tensor]:
        y = torch.empty(rows, outputs)
        assert lib.int8_matmul(x.data_ptr(), packed.data_ptr(), scale.data_ptr(), y.data_ptr(), rows, width, outputs,
                               torch.get_num_threads()) == 0
        return [y]
    return run


def int8k_case(rows: int, width: int, outputs: int) -> Case:
    """Q6_K's form (int8k: int8 steps, its own int8 scale per 16 inputs and fp16 d per 256): the
    1.17B's output layer (2048 x 49152, 108 MB, from memory), or a weight the caches hold."""
    g = torch.Generator().manual_seed(rows)
    steps = torch.randint(-32, 32, (outputs // 16, width, 16), dtype=torch.int8, generator=g)
    super_ = (torch.rand(outputs // 16, width // 256, 16, generator=g) / 100).half()
    sub = torch.randint(-128, 128, (outputs // 16, width // 16, 16), dtype=torch.int8, generator=g)
    x = torch.randn(rows, width, generator=g)

    def run(lib: ctypes.CDLL) -> list[torch.Tensor]:
        y = torch.empty(rows, outputs)
        assert lib.int8k_matmul(x.data_ptr(), steps.data_ptr(), super_.data_ptr(), sub.data_ptr(), y.data_ptr(), rows,
                                width, outputs, torch.get_num_threads()) == 0
        return [y]
    return run


def attention_case(steps: list[list[tuple[int, int]]], shape: tuple[int, int, int] = (HEADS, KV_HEADS, DIM)) -> Case:
    """Steps of sequences (new tokens, keys), each sequence's blocks at random places in one pool;
    `shape`: heads, kv heads, head dim."""
    heads, kv_heads, dim = shape
    g = torch.Generator().manual_seed(len(steps))
    blocks = sum(-(-ctx // BLOCK) for step in steps for _, ctx in step)
    k_pool = torch.randn(blocks, kv_heads, dim, BLOCK, generator=g)
    v_pool = torch.randn(blocks, BLOCK, kv_heads, dim, generator=g)
    order, calls = torch.randperm(blocks, generator=g).to(torch.int32), []
    for step in steps:
        width = max(-(-ctx // BLOCK) for _, ctx in step)
        tables = torch.zeros(len(step), width, dtype=torch.int32)
        for s, (_, ctx) in enumerate(step):
            tables[s, :-(-ctx // BLOCK)], order = order[:-(-ctx // BLOCK)], order[-(-ctx // BLOCK):]
        q_lens = torch.tensor([q for q, _ in step])
        starts = torch.cumsum(q_lens, 0) - q_lens
        calls.append((torch.randn(int(q_lens.sum()), heads * dim, generator=g), starts, q_lens,
                      torch.tensor([ctx for _, ctx in step]), tables))

    def run(lib: ctypes.CDLL) -> list[torch.Tensor]:
        outs = []
        # a side's kernels from before the scores' cap (softcap) take one argument fewer
        capped = (0.0,) if len(lib.paged_attention.argtypes) == 20 else ()
        for q, starts, q_lens, ctx, tables in calls:
            outs.append(torch.empty(q.shape[0], heads, dim))
            assert lib.paged_attention(q.data_ptr(), heads * dim, dim, k_pool.data_ptr(), v_pool.data_ptr(),
                                       outs[-1].data_ptr(), starts.data_ptr(), q_lens.data_ptr(), ctx.data_ptr(),
                                       tables.data_ptr(), tables.shape[1], tables.shape[0], heads, kv_heads, dim,
                                       BLOCK, 0, dim ** -0.5, *capped, torch.get_num_threads()) == 0
        return outs
    return run


def greedy_case(rows: int, vocab: int) -> Case:
    """greedy.c's rows: each row's first largest logit and its log probability."""
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(rows)) * 3

    def run(lib: ctypes.CDLL) -> list[torch.Tensor]:
        tokens, logprobs = torch.empty(rows, dtype=torch.int64), torch.empty(rows)
        assert lib.greedy_rows(logits.data_ptr(), rows, vocab, tokens.data_ptr(), logprobs.data_ptr(),
                               torch.get_num_threads()) == 0
        return [tokens, logprobs]
    return run


CASES: dict[str, Callable[[], Case]] = {  # each makes its inputs when it runs
    **{f"int4, a layer's 4 matmuls, {rows} rows": partial(int4_case, rows) for rows in (1, 16, 512)},
    **{f"int4 (Q4_K's form), the 1.17B's 16 layers, {rows} rows": partial(int4k_model_case, rows) for rows in (1, 16)},
    **{f"int4 (Q4_K's form), a 2048 x 8192 weight in the caches, {rows} rows": partial(int4k_model_case, rows, 0)
       for rows in (1, 2, 4, 8, 16)},
    **{f"int8 output layer, {rows} rows": partial(int8_case, rows) for rows in (1, 16)},
    **{f"int8 (Q6_K's form), the 1.17B's output layer, {rows} rows": partial(int8k_case, rows, 2048, VOCAB)
       for rows in (1, 2, 16)},
    "int8 (Q6_K's form), a 2048 x 4096 weight in the caches, 1 rows": partial(int8k_case, 1, 2048, 4096),
    **{f"int8 (Q5_0's form), Gemma's gate and up, {rows} rows": partial(int8_case, rows, *GEMMA_GATE_UP)
       for rows in (1, 16, 512)},
    "int8 output layer, Gemma's shape, 16 rows": partial(int8_case, 16, *GEMMA_OUTPUT),
    "attention, decode step of 16 sequences (300 to 600 keys)":
        partial(attention_case, [[(1, 300 + 20 * i) for i in range(16)]]),
    "attention, a 1,286-token prompt in chunks of 512":
        partial(attention_case, [[(512, 512)], [(512, 1024)], [(262, 1286)]]),
    "attention, Gemma's shape, decode step of 16 sequences (100 to 400 keys)":
        partial(attention_case, [[(1, 100 + 20 * i) for i in range(16)]], GEMMA_HEADS),
    "attention, Gemma's shape, eight 70-token prompts":
        partial(attention_case, [[(70, 70)] * 8], GEMMA_HEADS),
    "attention, Qwen 2.5 1.5B's shape, decode step of 16 sequences (300 to 600 keys)":
        partial(attention_case, [[(1, 300 + 20 * i) for i in range(16)]], QWEN_HEADS),
    "attention, Qwen 2.5 1.5B's shape, a 1,286-token prompt in chunks of 512":
        partial(attention_case, [[(512, 512)], [(512, 1024)], [(262, 1286)]], QWEN_HEADS),
    **{f"greedy rows, Gemma's 262,144 logits, {rows} rows": partial(greedy_case, rows, GEMMA_OUTPUT[1])
       for rows in (1, 16)},
}


def timed(run: Callable[[], Any]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def compare(libs: dict[str, ctypes.CDLL], repeats: int, names: list[str]) -> list[dict[str, Any]]:
    rows = []
    for name in names:
        make = CASES[name]
        case = make()
        outputs = {rev: case(lib) for rev, lib in libs.items()}
        same = all(torch.equal(a, b) for a, b in zip(*outputs.values(), strict=True))
        times: dict[str, list[float]] = {rev: [] for rev in libs}
        for _ in range(repeats):
            for rev, lib in libs.items():
                times[rev].append(timed(partial(case, lib)))
        base, head = (statistics.median(t) * 1e6 for t in times.values())
        rows.append({"case": name, "base_us": round(base, 1), "head_us": round(head, 1),
                     "speedup": round(base / head, 3), "bit_equal": same})
        print(f"{name}: {base:.1f} -> {head:.1f} us ({base / head:.2f}x), bit for bit: {same}", flush=True)
    return rows


def markdown(result: dict[str, Any]) -> str:
    revs = result["revs"]
    lines = ["# Two commits' C kernels side by side", "", f"{result['date']}, `{result['command']}`", "",
             f"Machine: {result['machine']['cpu_count']} CPUs, torch {result['machine']['torch']} "
             f"({result['machine']['torch_threads']} threads). Median of {result['repeats']} alternating calls.", "",
             f"| case | {revs['base']} (us) | {revs['head']} (us) | speedup | outputs bit for bit equal |",
             "| --- | --- | --- | --- | --- |"]
    lines += [f"| {r['case']} | {r['base_us']} | {r['head_us']} | {r['speedup']}x | {'yes' if r['bit_equal'] else 'NO'} |"
              for r in result["rows"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--base", required=True)
    p.add_argument("--head", default="HEAD")
    p.add_argument("--base-flags", default="", help="compiler flags after build.py's, for --base")
    p.add_argument("--head-flags", default="", help="compiler flags after build.py's, for --head")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--out", type=Path, default=None, help="also write results.json and results.md here")
    p.add_argument("--case", action="append", default=[], metavar="TEXT",
                   help="only the cases whose names contain TEXT (repeatable; default: every case)")
    args = p.parse_args(argv)
    names = [name for name in CASES if not args.case or any(text in name for text in args.case)]
    if not names:
        p.error(f"--case: no case's name contains {' or '.join(map(repr, args.case))}; the cases: {', '.join(CASES)}")
    revs = {name: subprocess.run(["git", "-C", str(build.HERE), "rev-parse", "--short", rev], capture_output=True,
                                 text=True, check=True).stdout.strip() for name, rev in (("base", args.base),
                                                                                         ("head", args.head))}
    flags = {"base": tuple(shlex.split(args.base_flags)), "head": tuple(shlex.split(args.head_flags))}
    with tempfile.TemporaryDirectory(prefix="kernel-ab-") as tmp:
        libs = {name: compile_rev(rev, Path(tmp) / name, flags[name]) for name, rev in revs.items()}
        rows = compare(libs, args.repeats, names)
    labels = {name: " ".join((rev, *flags[name])) for name, rev in revs.items()}  # the table's columns
    result = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "revs": labels, "repeats": args.repeats,
              "command": f"{PROG} " + " ".join(argv if argv is not None else sys.argv[1:]),
              "machine": machine_info(), "rows": rows}
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(result, indent=1))
        (args.out / "results.md").write_text(markdown(result))
    print(markdown(result))
    return 0 if all(r["bit_equal"] for r in rows) else 1

