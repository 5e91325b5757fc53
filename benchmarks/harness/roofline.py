"""The machine's limit beside every speed figure: what one decode stream could reach at best.

A decode step with one stream reads every layer weight and the output layer once (the embeddings
only one row per token), and the keys and values the stream has so far. Memory bandwidth then
bounds it: tokens a second <= bandwidth / bytes a step. A figure is published as its fraction of
that bound; many streams share each weight read, and are bounded by the products' instruction
rate instead (`python -m benchmarks multiply-rate`).

The bandwidth is measured as STREAM's read kernel measures it: a sum over a buffer far larger
than the caches (1 GiB), with the threads the servers run (2 by default), the best of several
passes. The buffer sits on 2 MB pages where the kernel allows, as the engine's weights do
(engine/model/huge_pages.py): on 4 KB pages the same sum read at about half the rate here.
"""
import argparse
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from engine.model import huge_pages

GIB = 1 << 30
EMBEDDINGS = "token_embd.weight"  # llama.cpp's name of the input embeddings
OUTPUT = "output.weight"  # of the output layer; absent where it is the embeddings (tied)


def read_bandwidth(size: int = GIB, threads: int = 2, passes: int = 5) -> float:
    """Bytes a second that `threads` threads read from memory: the best of `passes` sums over
    `size` bytes (a float32 sum is far from compute-bound on any CPU with SIMD)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        holder = torch.nn.Module()
        holder.register_buffer("buffer", torch.ones(size // 4, dtype=torch.float32))
        huge_pages.collapse(holder)
        buffer = holder.get_buffer("buffer")
        buffer.sum()  # paged in, and the pool's threads started
        best = float("inf")
        for _ in range(passes):
            started = time.perf_counter()
            buffer.sum()
            best = min(best, time.perf_counter() - started)
        return size / best
    finally:
        torch.set_num_threads(previous)


@dataclass(frozen=True)
class StepBytes:
    """What one stream's decode step reads of a GGUF model."""

    weights: int  # the layers' and the output layer's, as stored (quantized)
    kv_per_token: int  # the keys and values of one position, every layer (fp16)

    def at(self, context: int) -> int:
        """The step's bytes with `context` positions in the cache."""
        return self.weights + self.kv_per_token * context


def step_bytes(path: Path, kv_bytes: int = 2) -> StepBytes:
    """A GGUF file's decode-step bytes (`kv_bytes`: the cache's bytes per value, fp16's 2)."""
    from engine.model import gguf_file
    header = gguf_file.read(path)
    tensors = {t.name: t.data.nbytes for t in header.tensors}
    weights = sum(n for name, n in tensors.items() if name != EMBEDDINGS)
    if OUTPUT not in tensors:  # tied: the output layer reads the embeddings whole
        weights += tensors.get(EMBEDDINGS, 0)
    arch = header.metadata["general.architecture"]
    meta = header.metadata
    heads, kv_heads = int(meta[f"{arch}.attention.head_count"]), int(meta.get(f"{arch}.attention.head_count_kv", 0))
    head_dim = int(meta.get(f"{arch}.attention.key_length", int(meta[f"{arch}.embedding_length"]) // heads))
    layers = int(meta[f"{arch}.block_count"])
    return StepBytes(weights, 2 * layers * (kv_heads or heads) * head_dim * kv_bytes)


def bound(bandwidth: float, step: StepBytes, context: int) -> float:
    """One stream's tokens a second at the memory roofline, `context` positions in."""
    return bandwidth / step.at(context)


def fraction(tokens_per_s: float, bandwidth: float, step: StepBytes, context: int) -> float:
    """A measured one-stream rate as its fraction of the roofline."""
    return tokens_per_s / bound(bandwidth, step, context)


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks roofline", description=__doc__.splitlines()[0])
    p.add_argument("gguf", nargs="*", type=Path, help="GGUF files whose one-stream bound to give")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--context", type=int, default=64, help="positions in the cache (default 64)")
    args = p.parse_args(argv)
    bandwidth = read_bandwidth(threads=args.threads)
    print(f"read bandwidth, {args.threads} threads: {bandwidth / 1e9:.1f} GB/s")
    for path in args.gguf:
        step = step_bytes(path)
        print(f"{path.name}: {step.at(args.context) / 1e9:.3f} GB a step at {args.context} positions, "
              f"roofline {bound(bandwidth, step, args.context):.1f} tok/s")
    return 0
