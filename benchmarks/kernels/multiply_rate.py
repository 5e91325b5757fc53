"""python -m benchmarks multiply-rate [--out DIR]: how many integer products one core multiplies a
second, in the forms of a quantized dot product that AVX2 and AVX-512 have, from registers (no
memory):

- int16: `vpmaddwd` (16 products of int16 pairs, summed in pairs to int32), then `vpaddd` into an
  accumulator: the form of this service's int16 activations (quant_matmul.c);
- int8: `vpmaddubsw` (32 products of u8 and s8, summed in pairs to int16), `vpmaddwd` by ones to
  int32, then `vpaddd`: the form llama.cpp's AVX2 kernels give int8 activations;
- int8, two `vpmaddubsw` summed in int16 before the widening: faster where the values are small
  enough not to overflow int16, which int8 products of full range do not promise.

Where the CPU has AVX-512 with VNNI, the same forms at 512 bits too:
- int16, VNNI: `vpdpwssd` (32 products of int16 pairs, summed into the accumulator in one
  instruction): the form of this service's AVX-512 products (quant_tiles512.h);
- int16, `vpmaddwd` and `vpaddd` at 512 bits (AVX512BW without VNNI);
- int8, VNNI: `vpdpbusd` (64 products of u8 and s8, summed in fours into the accumulator): the
  form of llama.cpp's AVX512-VNNI kernels for int8 activations;
- int16, VNNI, with 2, 3, 4 or 6 fp32 multiplies (`vmulps`) beside each 16 `vpdpwssd`: the one
  arithmetic's own bound. Each row's block of 32 inputs takes 16 `vpdpwssd` for a group's 16
  outputs and then its scales (int4: (sum dx) d and dx sum(x) times m, three multiplies); where
  `vmulps` runs on the pipes that `vpdpwssd` does (a Zen 5 core's two), the products go no faster
  than this (benchmarks.kernels.products_rate.multiplies counts each kind's).

Four independent accumulators each for AVX2's forms, twelve for VNNI's (one instruction a
product's chain, so more of them in flight), so that the rate is the units' and not a chain's
latency. These are the bounds that the products' loops are measured against (docs/performance.md).
The C source is compiled with the system's `cc -O2`.
"""
import argparse
import subprocess
import tempfile
import time
from pathlib import Path

from engine.torch_vectors import cpu_flags

from .. import RESULTS
from ..harness.report import machine_info, write_results

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

# `vpdpwssd` with m fp32 multiplies beside each 16 (the one arithmetic's bound): its form's name
SCALED_FORM = "int16, vpdpwssd (512 bits), {} fp32 multiplies a 16"

# the 512-bit forms (AVX-512 with VNNI): twelve accumulators zmm0 to zmm11, zmm15 the operands
SOURCE512 = SOURCE.split("#define LOOP")[0] + r"""
#define LOOP(BODY) do { long it = n; double t = now(); \
    __asm__ volatile("vpternlogd $0xff,%%zmm15,%%zmm15,%%zmm15\n vpabsb %%zmm15,%%zmm15\n" \
                     "1:\n" BODY "dec %0\n jnz 1b\n" : "+r"(it) :: "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", \
                     "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm15", "cc"); \
    seconds = now() - t; } while (0)
#define TWELVE(F) F("0") F("1") F("2") F("3") F("4") F("5") F("6") F("7") F("8") F("9") F("10") F("11")
#define DPWSSD(A) "vpdpwssd %%zmm15,%%zmm15,%%zmm" A "\n"
#define DPBUSD(A) "vpdpbusd %%zmm15,%%zmm15,%%zmm" A "\n"
#define MADDWD(A) "vpmaddwd %%zmm15,%%zmm15,%%zmm12\n vpaddd %%zmm12,%%zmm" A ",%%zmm" A "\n"
/* 16 accumulators for 16 `vpdpwssd` a pass, beside M fp32 multiplies (by 1.0, on 1.0: no
 * subnormals), each on a chain of its own in zmm20 to zmm25 */
#define SIXTEEN(F) TWELVE(F) F("16") F("17") F("18") F("19")
#define MULPS(A) "vmulps %%zmm14,%%zmm" A ",%%zmm" A "\n"
#define SCALED(M, BODY) do { long it = n; double t = now(); \
    __asm__ volatile("vpternlogd $0xff,%%zmm15,%%zmm15,%%zmm15\n vpsrld $25,%%zmm15,%%zmm14\n" \
                     "vpslld $23,%%zmm14,%%zmm14\n vpabsb %%zmm15,%%zmm15\n vmovaps %%zmm14,%%zmm20\n" \
                     "vmovaps %%zmm14,%%zmm21\n vmovaps %%zmm14,%%zmm22\n vmovaps %%zmm14,%%zmm23\n" \
                     "vmovaps %%zmm14,%%zmm24\n vmovaps %%zmm14,%%zmm25\n" \
                     "1:\n" SIXTEEN(DPWSSD) BODY "dec %0\n jnz 1b\n" : "+r"(it) :: "xmm0", "xmm1", "xmm2", "xmm3", \
                     "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm14", "xmm15", "xmm16", \
                     "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22", "xmm23", "xmm24", "xmm25", "cc"); \
    printf("SCALED_FORM\t%.2f\n", M, 16.0 * 32 * n / (now() - t) / 1e9); \
    } while (0)
int main(void) {
    long n = 100000000; double seconds;
    LOOP(TWELVE(DPWSSD));
    printf("int16, vpdpwssd (512 bits)\t%.2f\n", 12.0 * 32 * n / seconds / 1e9);
    LOOP(MADDWD("0") MADDWD("1") MADDWD("2") MADDWD("3"));
    printf("int16, vpmaddwd and vpaddd (512 bits)\t%.2f\n", 4.0 * 32 * n / seconds / 1e9);
    LOOP(TWELVE(DPBUSD));
    printf("int8, vpdpbusd (512 bits)\t%.2f\n", 12.0 * 64 * n / seconds / 1e9);
    SCALED(2, MULPS("20") MULPS("21"));
    SCALED(3, MULPS("20") MULPS("21") MULPS("22"));
    SCALED(4, MULPS("20") MULPS("21") MULPS("22") MULPS("23"));
    SCALED(6, MULPS("20") MULPS("21") MULPS("22") MULPS("23") MULPS("24") MULPS("25"));
    return 0;
}
"""
SOURCE512 = SOURCE512.replace("SCALED_FORM", SCALED_FORM.format("%d"))


def measure() -> list[tuple[str, float]]:
    """(form, billions of products a second on one core), each form's loop run once: AVX2's, then
    AVX-512's where the CPU has it with VNNI."""
    programs = [(SOURCE, ["-mavx2"])]
    if {"avx512bw", "avx512_vnni"} <= cpu_flags():
        programs.append((SOURCE512, ["-mavx512f", "-mavx512bw", "-mavx512vnni"]))
    lines: list[str] = []
    with tempfile.TemporaryDirectory() as folder:
        for i, (text, flags) in enumerate(programs):
            source, binary = Path(folder) / f"rate{i}.c", Path(folder) / f"rate{i}"
            source.write_text(text)
            subprocess.run(["cc", "-O2", *flags, str(source), "-o", str(binary)], check=True)
            lines += subprocess.run([str(binary)], capture_output=True, text=True, check=True).stdout.splitlines()
    return [(form, float(rate)) for form, rate in (line.split("\t") for line in lines)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks multiply-rate", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS / "multiply-rate")
    args = parser.parse_args(argv)
    info = machine_info()
    rows = measure()
    text = "\n".join([
        "# Integer products a second, one core, in AVX2's and AVX-512's forms", "",
        f"{time.strftime('%Y-%m-%dT%H:%M:%S%z')}, git {info['git']}, `python -m benchmarks multiply-rate`", "",
        "| form | billion products a second |", "| --- | --- |",
        *(f"| {form} | {rate:.1f} |" for form, rate in rows), ""])
    write_results(args.out, text)
    return 0
