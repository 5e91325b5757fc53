"""python -m benchmarks products [--model FILE] [--rows 1,16,64,512] [--out DIR]: the quantized
products of a GGUF model's layers, timed alone, against the machine's bounds.

For each kind of layer the load made of the file (Q4_K's int4 layers, Q6_K's int8 ones, ...),
every layer of that kind is run on `rows` rows of random activations, over and over for two
seconds, with the engine's threads (every core). It reports billions of products a second (rows x
inputs x outputs), and:
- against the multiply bound: one core's rate in the form this service's products take
  (benchmarks.multiply_rate: VNNI's `vpdpwssd` where the CPU has it, else `vpmaddwd` and `vpaddd`),
  times the threads. Batched rows (sixteen streams, a prompt) are bound by it;
- where that form is VNNI's, against the one arithmetic's bound too: the fp32 multiplies that the
  arithmetic asks of each row beside each block's `vpdpwssd` (int4: dx, d and dx sum(x) times m,
  three a block of 32) run on the same two pipes of a Zen 5 core as `vpdpwssd`, so the products
  can go no faster than `vpdpwssd` beside them (multiply_rate measures that rate for 2 to 6
  multiplies a 16 `vpdpwssd`);
- at one row, the bytes of the layers' buffers read a second, against the read bandwidth that
  `benchmarks.harness.roofline` measures: one stream's decode is bound by that.

It says how far the kernels are from the machine's limits without the rest of a step (attention,
norms, the scheduler, the prompts' share of a served load). The model: the random-weight 1.17B
Llama-shaped Q4_K_M of the sizes record by default (made on demand).
"""
import time
from pathlib import Path
from typing import Any, Optional

import torch

from contract import EngineConfig
from engine.model.int4 import Int4Linear, Int8Linear
from engine.model.loader import load_model
from engine.torch_vectors import cpu_flags

from .. import RESULTS
from ..harness import sized_models
from ..harness.report import machine_info, write_results
from ..harness.roofline import read_bandwidth
from .multiply_rate import SCALED_FORM
from .multiply_rate import measure as multiply_rates

SECONDS = 2.0
MIN_PASSES = 3


def our_form(rates: list[tuple[str, float]]) -> tuple[str, float]:
    """The form (and one core's rate) that this service's products take on this CPU."""
    found = dict(rates)
    wanted = "int16, vpdpwssd (512 bits)" if {"avx512bw", "avx512_vnni"} <= cpu_flags() else "int16"
    return wanted, found[wanted]


def multiplies(layer: torch.nn.Module) -> int:
    """The fp32 multiplies a row's 16 `vpdpwssd` (512 products: a block of 32 inputs, 16 outputs)
    carry in the one arithmetic: int4, (sum dx) d and dx sum(x) times m: 3; int8 by blocks of 32
    (Q8_0's form), (sum dx) d: 2; by sub-blocks of 16 (Q6_K's, Q5_K's), twice that, and with lows
    (dx sum(x) times m) three a sub-block. The scales' own products (Q4_K's d sc), shared by a
    tile's rows, are left out."""
    if isinstance(layer, Int4Linear):
        return 3
    if layer.own_scales or layer.sub:
        return 6 if layer.lows is not None and not layer.own_scales else 4
    return 2


def arithmetic_seconds(layers: list[torch.nn.Module], rows: int, rates: list[tuple[str, float]],
                       threads: int) -> Optional[float]:
    """Seconds a pass over `layers` at `rows` rows takes at the one arithmetic's bound: each
    layer's products at one core's rate of `vpdpwssd` beside its multiplies, times the threads
    (None where multiply_rate has no such rate: no VNNI)."""
    found, seconds = dict(rates), 0.0
    for layer in layers:
        rate = found.get(SCALED_FORM.format(multiplies(layer)))
        if rate is None:
            return None
        seconds += rows * layer.in_features * layer.out_features / (rate * threads * 1e9)
    return seconds


def kinds(model: torch.nn.Module) -> dict[str, list[torch.nn.Module]]:
    """The model's quantized layers by kind: the class and the scales' form."""
    found: dict[str, list[torch.nn.Module]] = {}
    for module in model.modules():
        if isinstance(module, (Int4Linear, Int8Linear)):
            own = " (the file's own scales)" if module.own_scales else ""
            found.setdefault(f"{type(module).__name__}{own}", []).append(module)
    return found


def layer_bytes(layer: torch.nn.Module) -> int:
    return sum(buffer.numel() * buffer.element_size() for buffer in layer.buffers(recurse=False))


def timed(layers: list[torch.nn.Module], rows: int) -> float:
    """Seconds a pass over `layers` takes at `rows` rows: the best of the passes in SECONDS, and of
    MIN_PASSES at least, so that one pass a neighbour's process delayed does not decide it."""
    inputs = {layer.in_features: torch.randn(rows, layer.in_features) for layer in layers}
    for layer in layers:  # warm: the products' buffers and the threads
        layer(inputs[layer.in_features])
    best, ends, passes = float("inf"), time.perf_counter() + SECONDS, 0
    while time.perf_counter() < ends or passes < MIN_PASSES:
        passes += 1
        started = time.perf_counter()
        for layer in layers:
            layer(inputs[layer.in_features])
        best = min(best, time.perf_counter() - started)
    return best


def measure(model_file: Path, rows: list[int]) -> dict[str, Any]:
    loaded = load_model(EngineConfig(model=str(model_file)))
    threads = torch.get_num_threads()
    rates = multiply_rates()
    form, per_core = our_form(rates)
    bandwidth = read_bandwidth(threads=threads)
    result: dict[str, Any] = {"model": model_file.name, "threads": threads, "form": form,
                              "bound_g_s": round(per_core * threads, 1), "bandwidth_gb_s": round(bandwidth / 1e9, 1),
                              "kinds": {}}
    for kind, layers in kinds(loaded.model).items():
        products = sum(layer.in_features * layer.out_features for layer in layers)
        stored = sum(map(layer_bytes, layers))
        entry: dict[str, Any] = {"layers": len(layers), "bytes_a_weight": round(stored / products, 3),
                                 "rows": {}}
        for n in rows:
            seconds = timed(layers, n)
            rate = n * products / seconds / 1e9
            figures = {"g_products_s": round(rate, 1), "of_bound": round(rate / result["bound_g_s"], 3)}
            if form.startswith("int16, vpdpwssd") and (at_bound := arithmetic_seconds(layers, n, rates, threads)):
                figures["of_arithmetic"] = round(at_bound / seconds, 3)
            if n == 1:
                read = stored / seconds
                figures |= {"gb_s": round(read / 1e9, 1), "of_bandwidth": round(read / bandwidth, 3)}
            entry["rows"][str(n)] = figures
        result["kinds"][kind] = entry
    return result


def table(result: dict[str, Any], command: str, git: Optional[str]) -> str:
    lines = [f"# The quantized products of {result['model']}, alone", "",
             f"{time.strftime('%Y-%m-%d')}, git {git}, `{command}`; {result['threads']} threads. Multiply bound: "
             f"{result['bound_g_s']} billion products a second ({result['form']}, one core's rate times the threads); "
             f"read bandwidth {result['bandwidth_gb_s']} GB/s. The arithmetic's bound: `vpdpwssd` beside the fp32 "
             "multiplies each kind's blocks carry (products_rate.multiplies).", "",
             "| layers | bytes a weight | rows | billion products a second | of the multiply bound "
             "| of the arithmetic's bound | one row: GB/s read, of the bandwidth |",
             "|---|---|---|---|---|---|---|"]
    for kind, entry in result["kinds"].items():
        for n, figures in entry["rows"].items():
            read = f"{figures['gb_s']} ({figures['of_bandwidth']:.0%})" if "gb_s" in figures else ""
            arithmetic = f"{figures['of_arithmetic']:.0%}" if "of_arithmetic" in figures else ""
            lines.append(f"| {kind}, {entry['layers']} | {entry['bytes_a_weight']} | {n} | {figures['g_products_s']} "
                         f"| {figures['of_bound']:.0%} | {arithmetic} | {read} |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    p = sized_models.model_parser("python -m benchmarks products", __doc__ or "", RESULTS / "products")
    p.add_argument("--rows", default="1,16,64,512")
    args = p.parse_args(argv)
    result = measure(sized_models.model_file(args.model), [int(n) for n in args.rows.split(",")])
    command = "python -m benchmarks products " + " ".join(argv or [])
    text = table(result, command.strip(), machine_info().get("git"))
    write_results(args.out, text, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
