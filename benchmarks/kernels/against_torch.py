"""The engine's C kernels against the PyTorch ops they replace, side by side in one run.

    python -m benchmarks kernels [--out benchmarks/results/kernels] [--repeats 3]

(A published run: docs/benchmarks/archive/2026-11-kernels/by-kernel/results.md.)

int4 matmul: `quant_matmul.c` against `_weight_int4pack_mm_for_cpu`, on SmolLM2-135M's layer
shapes at 1, 16 and 512 rows. int8 matmul (the output layer): `quant_matmul.c` against
`_weight_int8pack_mm` at 1 and 16 rows. Attention: `paged_attention.c` against one SDPA call per sequence
over keys gathered from the pool (its fallback), for a 16-row decode step and a 16-prompt
prefill, packed and paged as the engine runs them. Each pair is
timed in alternation, `--repeats` times; the table gives microseconds per call (median) and the
error of each matmul kernel against float64 on the activations as it rounds them (the C kernels:
int16 per block of 32; PyTorch's: bf16).

A second table times the C attention over an fp16 pool against an fp32 one (EngineConfig's
kv_cache_dtype) for a 16-row decode step through 30 layers' pools, as a step of the default
model reads them (each layer's keys once, from memory), and checks that the fp16 pool gives
the fp32 kernel's bits on the same (fp16) values.
"""
import argparse
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Optional

import torch
from torch import nn

from engine.core.kv_pool import KVPool, KVShape
from engine.kernels import build, native
from engine.model import paged_attention
from engine.model.int4 import Int4Linear, Int8Linear, _quantize, dequantize, int16_blocks, q8_0

from .. import RESULTS
from ..harness.report import write_results

SHAPES = [(576, 576), (576, 192), (576, 1536), (1536, 576)]  # (in, out): q/o, k/v, gate/up, down
ROWS = [1, 16, 512]


def per_call_us(fn: Callable[[], object], seconds: float = 0.2) -> float:
    fn()
    calls, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        fn()
        calls += 1
    return (time.perf_counter() - started) / calls * 1e6


@contextmanager
def pytorch_ops() -> Iterator[None]:
    """As where no compiler builds the C kernels."""
    real = build.library
    build.library = lambda: None  # type: ignore[assignment]
    try:
        yield
    finally:
        build.library = real


def int4_pair(inputs: int, outputs: int) -> tuple[Int4Linear, Int4Linear, torch.Tensor]:
    """(C layer, PyTorch layer, the float64 weight both hold)."""
    torch.manual_seed(0)
    linear = nn.Linear(inputs, outputs, bias=False)
    steps, scale, low, _ = _quantize(linear.weight.detach())
    c_layer = Int4Linear(linear, steps, scale, low)
    with pytorch_ops():
        torch_layer = Int4Linear(linear, steps, scale, low)
    weight = dequantize(steps, scale, low, torch.float64)
    return c_layer, torch_layer, weight


def rounded(x: torch.Tensor, activations: Optional[str]) -> torch.Tensor:
    """x as a kernel rounds it before its exact products, in float64."""
    return int16_blocks(x) if activations == "int16" else x.to(torch.bfloat16).double()


def int4_rows(repeats: int) -> list[str]:
    lines = []
    for inputs, outputs in SHAPES:
        c_layer, torch_layer, weight = int4_pair(inputs, outputs)
        for rows in ROWS:
            x = torch.randn(rows, inputs)
            errors = [(layer(x).double() - rounded(x, kernel) @ weight.t()).abs().max().item()
                      for layer, kernel in ((c_layer, native.int4_activations()), (torch_layer, "bf16"))]
            times = alternate([partial(c_layer, x), partial(torch_layer, x)], repeats)
            lines.append(f"| int4 {inputs}x{outputs} | {rows} | {times[0]:.1f} | {times[1]:.1f} | "
                         f"{times[1] / times[0]:.2f}x | {errors[0]:.1e} | {errors[1]:.1e} |")
    return lines


def int8_rows(repeats: int) -> list[str]:
    """The output layer, 576 to 49,152 (SmolLM2's vocabulary): quant_matmul.c against
    `_weight_int8pack_mm`, errors against float64 on the same int8 weights and x as each rounds it."""
    torch.manual_seed(0)
    linear = nn.Linear(576, 49152, bias=False)
    c_layer = Int8Linear(linear)
    with pytorch_ops():
        torch_layer = Int8Linear(linear)
    steps, scale = q8_0(linear.weight.detach())  # the C layer's Q8_0, a scale per block of 32
    weights = (steps.double() * scale.double().repeat_interleave(32, dim=1)[:, :576],
               torch_layer.weight_int8.double() * torch_layer.scales.double()[:, None])  # a scale per output
    lines = []
    for rows in (1, 16):
        x = torch.randn(rows, 576)
        errors = [(layer(x).double() - rounded(x, kind) @ weight.t()).abs().max().item()
                  for layer, kind, weight in ((c_layer, native.int4_activations(), weights[0]),
                                              (torch_layer, "bf16", weights[1]))]
        times = alternate([partial(c_layer, x), partial(torch_layer, x)], repeats)
        lines.append(f"| int8 576x49152 | {rows} | {times[0]:.1f} | {times[1]:.1f} | {times[1] / times[0]:.2f}x | "
                     f"{errors[0]:.1e} | {errors[1]:.1e} |")
    return lines


def attention_rows(repeats: int) -> list[str]:
    """SmolLM2-135M's attention (9 heads, 3 kv heads, dim 64) over 16 sequences of 110 to 200 keys."""
    lines = []
    for step, decode in (("decode", True), ("prefill", False)):
        width = 200 if decode else 110
        ctx = [width - 6 * r for r in range(16)]
        q_lens = [1] * 16 if decode else ctx
        pool = KVPool(KVShape(1, 3, 64, torch.float32), sum(-(-n // 16) for n in ctx), torch.device("cpu"))
        pool.keys.normal_()
        pool.values.normal_()
        tables, at = [], 1
        for n in ctx:
            tables.append(list(range(at, at + -(-n // 16))))
            at += len(tables[-1])
        slots = torch.tensor([t[p // 16] * 16 + p % 16 for t, q, n in zip(tables, q_lens, ctx, strict=True)
                              for p in range(n - q, n)])
        query = torch.randn(1, len(slots), 9, 64).transpose(1, 2)
        key, value = torch.randn(2, 1, 3, len(slots), 64)
        paged = paged_attention.PagedStep(pool, slots, q_lens, ctx, tables)
        args = (query, key, value, paged)
        times = alternate([partial(attend, *args), partial(attend, *args, kernel=False)], repeats)
        lines.append(f"| attention, {step}, 16 sequences of {width - 90} to {width} keys | 16 | {times[0]:.1f} | "
                     f"{times[1]:.1f} | {times[1] / times[0]:.2f}x | | |")
    return lines


def kv_dtype_rows(repeats: int, layers: int = 30) -> list[str]:
    """A 16-row decode step's attention through `layers` pools, fp32 against fp16."""
    lines = []
    for keys in (200, 600, 2000):
        ctx, blocks = [keys] * 16, 16 * -(-keys // 16)
        tables = [list(range(1 + s * (blocks // 16), 1 + (s + 1) * (blocks // 16))) for s in range(16)]
        args = paged_attention.PagedStep(KVPool(KVShape(1, 3, 64, torch.float32), 1, torch.device("cpu")),
                                         torch.zeros(16, dtype=torch.long), [1] * 16, ctx, tables).c_args
        query = torch.randn(1, 16, 9, 64).transpose(1, 2)
        half = [tuple(torch.randn(blocks + 1, 3, 64, 16).half() for _ in range(2)) for _ in range(layers)]
        pools = {torch.float16: half, torch.float32: [(k.float(), v.float()) for k, v in half]}  # the same values
        wide, half = (_decode_step(query, pools[dtype], args) for dtype in (torch.float32, torch.float16))
        equal = all(a is not None and b is not None and torch.equal(a, b) for a, b in zip(wide, half, strict=True))
        times = alternate([partial(_decode_step, query, pools[dtype], args) for dtype in (torch.float32, torch.float16)],
                          repeats)
        lines.append(f"| decode step, 16 sequences of {keys} keys, {layers} layers | {times[0]:.0f} | {times[1]:.0f} | "
                     f"{times[0] / times[1]:.2f}x | {'yes' if equal else 'NO'} |")
    return lines


def _decode_step(query: torch.Tensor, pools: list[tuple[torch.Tensor, torch.Tensor]],
                 args: tuple[torch.Tensor, ...]) -> list[Optional[torch.Tensor]]:
    return [native.paged_attention(query, k, v.view(-1, 16, 3, 64), args, 0.125, 0) for k, v in pools]


class _Layer(nn.Module):
    layer_idx = 0


def attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, paged: paged_attention.PagedStep,
           kernel: bool = True) -> None:
    if kernel:
        paged_attention.paged_attention(_Layer(), query, key, value, None, scaling=0.125, paged=paged)
        return
    with pytorch_ops():
        paged_attention.paged_attention(_Layer(), query, key, value, None, scaling=0.125, paged=paged)


def alternate(fns: list[Callable[[], object]], repeats: int) -> list[float]:
    samples: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, into in zip(fns, samples, strict=True):
            into.append(per_call_us(fn))
    return [statistics.median(s) for s in samples]


def main(argv: Optional[list[str]] = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks kernels", description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=RESULTS / "kernels")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    if not native.int4_ready():
        raise SystemExit("the C kernels do not run here (no C compiler, or none of AVX512-BF16, AVX512-VNNI, AVX2 + FMA): "
                         "nothing to compare")
    header = ["| kernel | rows | C (us) | PyTorch (us) | C speed-up | C error | PyTorch error |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    body = int4_rows(args.repeats) + int8_rows(args.repeats) + attention_rows(args.repeats)
    text = (f"# C kernels against PyTorch's\n\n{torch.get_num_threads()} torch threads, torch {torch.__version__}, "
            f"{args.repeats} alternating repeats (median).\n\n" + "\n".join(header + body) + "\n")
    if native.kv_half_ready():
        kv = ["| the C attention | fp32 pool (us) | fp16 pool (us) | fp16 speed-up | bit for bit fp32's on the same values |",
              "| --- | --- | --- | --- | --- |"] + kv_dtype_rows(args.repeats)
        text += "\n## The KV cache's dtype\n\n" + "\n".join(kv) + "\n"
    write_results(args.out, text)

