"""PyTorch's CPU code pinned to one vector width, so that its operations between the C kernels
(the rotary embedding's sin and cos, sampling's softmax) compute the same bits on every x86 CPU.

PyTorch compiles its CPU operations once per width (default, AVX2, AVX-512) and picks the widest
the CPU runs at its first operation; their sums and polynomials round by that width. Where the
CPU has AVX2 and FMA, this sets ATEN_CPU_CAPABILITY=avx2 unless the operator set it, as the
engine's package is imported (before its first operation; PyTorch reads it then).
"""
import os
from pathlib import Path

PINNED = "avx2"


def cpu_flags() -> set[str]:
    """The first CPU's feature flags (empty where /proc/cpuinfo cannot be read)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.split(":")[0].strip() in ("flags", "Features"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def pin() -> None:
    if {"avx2", "fma"} <= cpu_flags():
        os.environ.setdefault("ATEN_CPU_CAPABILITY", PINNED)
