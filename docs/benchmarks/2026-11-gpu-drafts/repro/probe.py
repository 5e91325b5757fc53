"""What batch_invariant.py (beside this file) rests on, and what it costs, on a GPU: a row's bits in tiles and
without them as more rows share the call (Linear, LayerNorm, RMSNorm); one query's SDPA over keys
padded to several widths (which tiles do not touch); and the time of a product in tiles against
the plain one at several row counts (the 1.1B llama's shapes, bf16)."""
import contextlib
import functools
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers.models.llama.modeling_llama import LlamaRMSNorm

sys.path.insert(0, str(Path(__file__).parent))
from batch_invariant import in_tiles  # noqa: E402 - the module measured, beside this file

DEVICE = "cuda"
ROWS = (1, 2, 3, 8, 16, 17, 33, 40, 64, 65, 100, 128, 129, 257, 512)


def differs(layer, x: torch.Tensor, tiled: bool) -> list[int]:
    run = (lambda t: in_tiles(layer, t)) if tiled else layer
    alone = run(x[:1])
    return [m for m in ROWS if not torch.equal(run(x[:m])[:1], alone)]


@torch.inference_mode()
def rows() -> None:
    for dtype in (torch.bfloat16, torch.float32):
        name = str(dtype)[6:]
        for k, n in ((64, 256), (768, 2304), (3072, 768), (768, 50257), (2048, 2048), (2048, 5632), (5632, 2048),
                     (2048, 32000)):
            layer = nn.Linear(k, n, device=DEVICE, dtype=dtype)
            x = torch.randn(512, k, device=DEVICE, dtype=dtype)
            print(f"{name:9} linear {k:5}->{n:6}: plain differs at M={differs(layer, x, False)} "
                  f"tiled at M={differs(layer, x, True)}", flush=True)
        for width in (64, 768, 2048):
            x = torch.randn(512, width, device=DEVICE, dtype=dtype)
            for layer in (nn.LayerNorm(width, device=DEVICE, dtype=dtype), LlamaRMSNorm(width).to(DEVICE, dtype)):
                print(f"{name:9} {type(layer).__name__} {width}: plain differs at M={differs(layer, x, False)} "
                      f"tiled at M={differs(layer, x, True)}", flush=True)


def one_query(q, keys, values, backend, n_rows: int, width: int, ctx: int = 37) -> torch.Tensor:
    """Row 0's attention (ctx keys) beside n_rows - 1 others, every row's keys padded to width."""
    lengths = [ctx] + [min(width, 20 + 50 * i) for i in range(1, n_rows)]
    seen = torch.arange(width, device=DEVICE)[None, :] < torch.tensor(lengths, device=DEVICE)[:, None]
    with sdpa_kernel(backend) if backend else contextlib.nullcontext():
        return F.scaled_dot_product_attention(q[:n_rows], keys[:n_rows, :, :width], values[:n_rows, :, :width],
                                              attn_mask=seen[:, None, None, :], enable_gqa=True)[0]


@torch.inference_mode()
def attention() -> None:
    heads, kv_heads, dim = 32, 4, 64
    for dtype in (torch.bfloat16, torch.float32):
        q = torch.randn(8, heads, 1, dim, device=DEVICE, dtype=dtype)
        keys = torch.randn(8, kv_heads, 4096, dim, device=DEVICE, dtype=dtype)
        values = torch.randn(8, kv_heads, 4096, dim, device=DEVICE, dtype=dtype)
        for backend in (None, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH):
            try:
                alone = one_query(q, keys, values, backend, 1, 64)
                out = [f"{r}x{w}:{'=' if torch.equal(one_query(q, keys, values, backend, r, w), alone) else 'DIFF'}"
                       for r in (1, 8) for w in (64, 128, 256, 384, 512, 640, 768, 1024, 2048, 4096)]
            except RuntimeError as exc:
                out = [f"unavailable ({str(exc).splitlines()[0][:80]})"]
            print(str(dtype)[6:], "sdpa", backend.name if backend else "default", " ".join(out), flush=True)


@torch.inference_mode()
def timing() -> None:
    print("bf16 product time, tiled / plain, microseconds (median of 50 after 10 warm-ups):")
    for k, n in ((2048, 2560), (2048, 2048), (2048, 11264), (5632, 2048), (2048, 32000)):
        layer = nn.Linear(k, n, bias=False, device=DEVICE, dtype=torch.bfloat16)
        cells = []
        for m in (1, 16, 64, 512, 2048):
            x = torch.randn(m, k, device=DEVICE, dtype=torch.bfloat16)
            times = {}
            for name, fn in (("plain", layer), ("tiled", functools.partial(in_tiles, layer))):
                for _ in range(10):
                    fn(x)
                samples = []
                for _ in range(50):
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    fn(x)
                    end.record()
                    end.synchronize()
                    samples.append(start.elapsed_time(end) * 1000)
                times[name] = sorted(samples)[25]
            cells.append(f"M={m}: {times['tiled']:.1f}/{times['plain']:.1f}")
        print(f"  {k}->{n}: " + ", ".join(cells), flush=True)


if __name__ == "__main__":
    torch.manual_seed(0)
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    rows()
    attention()
    timing()
