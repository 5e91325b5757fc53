"""python -m benchmarks multiply-rate [--out DIR]: how many integer products one core multiplies a
second, in AVX2's two forms of a quantized dot product, from registers (no memory):

- int16: `vpmaddwd` (16 products of int16 pairs, summed in pairs to int32), then `vpaddd` into an
  accumulator: the form of this service's int16 activations (quant_matmul.c);
- int8: `vpmaddubsw` (32 products of u8 and s8, summed in pairs to int16), `vpmaddwd` by ones to
  int32, then `vpaddd`: the form llama.cpp's AVX2 kernels give int8 activations;
- int8, two `vpmaddubsw` summed in int16 before the widening: faster where the values are small
  enough not to overflow int16, which int8 products of full range do not promise.

Four independent accumulators each, so that the rate is the units' and not a chain's latency.
These are the bounds that the products' loops are measured against (docs/performance.md). AVX2
machines only (the instructions are AVX2's); the C source is compiled with the system's `cc -O2`.
"""
import argparse
import subprocess
import tempfile
import time
from pathlib import Path

from .. import RESULTS
from ..harness.report import machine_info

SOURCE = r"""
#include <stdio.h>
#include <time.h>
static double now(void) { struct timespec a; clock_gettime(CLOCK_MONOTONIC, &a); return a.tv_sec + a.tv_nsec * 1e-9; }
#define LOOP(BODY, ...) do { long it = n; double t = now(); \
    __asm__ volatile("vpcmpeqw %%ymm15,%%ymm15,%%ymm15\n vpabsb %%ymm15,%%ymm14\n vpabsw %%ymm15,%%ymm13\n" \
                     "1:\n" BODY "dec %0\n jnz 1b\n" : "+r"(it) :: __VA_ARGS__, "ymm13", "ymm14", "ymm15", "cc"); \
    seconds = now() - t; } while (0)
/* one accumulator's chain: int16's product and sum; int8's products, widening and sum; and int8's
 * with two products summed in int16 first (T, U: scratch registers; A: the accumulator) */
#define INT16(A, T) "vpmaddwd %%ymm15,%%ymm15,%%ymm" T "\n vpaddd %%ymm" T ",%%ymm" A ",%%ymm" A "\n"
#define INT8(A, T) "vpmaddubsw %%ymm14,%%ymm14,%%ymm" T "\n vpmaddwd %%ymm13,%%ymm" T ",%%ymm" T "\n" \
    "vpaddd %%ymm" T ",%%ymm" A ",%%ymm" A "\n"
#define INT8_PAIR(A, T, U) "vpmaddubsw %%ymm14,%%ymm14,%%ymm" T "\n vpmaddubsw %%ymm14,%%ymm14,%%ymm" U "\n" \
    "vpaddw %%ymm" U ",%%ymm" T ",%%ymm" T "\n vpmaddwd %%ymm13,%%ymm" T ",%%ymm" T "\n" \
    "vpaddd %%ymm" T ",%%ymm" A ",%%ymm" A "\n"
int main(void) {
    long n = 200000000; double seconds;
    LOOP(INT16("0", "4") INT16("1", "5") INT16("2", "6") INT16("3", "7"),
         "ymm0", "ymm1", "ymm2", "ymm3", "ymm4", "ymm5", "ymm6", "ymm7");
    printf("int16\t%.2f\n", 4.0 * 16 * n / seconds / 1e9);
    LOOP(INT8("0", "4") INT8("1", "5") INT8("2", "6") INT8("3", "7"),
         "ymm0", "ymm1", "ymm2", "ymm3", "ymm4", "ymm5", "ymm6", "ymm7");
    printf("int8\t%.2f\n", 4.0 * 32 * n / seconds / 1e9);
    LOOP(INT8_PAIR("0", "4", "8") INT8_PAIR("1", "5", "9"), "ymm0", "ymm1", "ymm4", "ymm5", "ymm8", "ymm9");
    printf("int8, two vpmaddubsw summed\t%.2f\n", 2.0 * 64 * n / seconds / 1e9);
    return 0;
}
"""


def measure() -> list[tuple[str, float]]:
    """(form, billions of products a second on one core), each form's loop run once."""
    with tempfile.TemporaryDirectory() as folder:
        source, binary = Path(folder) / "rate.c", Path(folder) / "rate"
        source.write_text(SOURCE)
        subprocess.run(["cc", "-O2", "-mavx2", str(source), "-o", str(binary)], check=True)
        lines = subprocess.run([str(binary)], capture_output=True, text=True, check=True).stdout.splitlines()
    return [(form, float(rate)) for form, rate in (line.split("\t") for line in lines)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks multiply-rate", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS / "multiply-rate")
    args = parser.parse_args(argv)
    info = machine_info()
    rows = measure()
    text = "\n".join([
        "# Integer products a second, one core, AVX2's two forms", "",
        f"{time.strftime('%Y-%m-%dT%H:%M:%S%z')}, git {info['git']}, `python -m benchmarks multiply-rate`", "",
        "| form | billion products a second |", "| --- | --- |",
        *(f"| {form} | {rate:.1f} |" for form, rate in rows), ""])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.md").write_text(text)
    print(text)
    return 0
