"""Row 0 of a matmul, alone and with M-1 other rows, bit for bit (bf16 and fp32, the test and
benchmark models' shapes); then one query's SDPA over keys padded (masked) to several widths,
alone and batched. Prints where they differ."""
import torch
import torch.nn.functional as F

DEVICE = "cuda"
SHAPES = ((64, 64), (64, 2000), (64, 256), (768, 768), (768, 2304), (768, 3072), (3072, 768), (768, 50257),
          (2048, 2048), (2048, 5632), (2048, 32000))


def listed(counts: list[int]) -> str:
    return f"{counts[:12]}{'...' if len(counts) > 12 else ''}"


def matmuls(dtype: torch.dtype) -> None:
    for k, n in SHAPES:
        weight = torch.randn(n, k, device=DEVICE, dtype=dtype) / k ** 0.5
        bias = torch.randn(n, device=DEVICE, dtype=dtype)
        x = torch.randn(1, 64, k, device=DEVICE, dtype=dtype)
        linear = F.linear(x[:, :1], weight, bias)
        addmm = torch.addmm(bias, x[0, :1], weight.t())
        bad_linear = [m for m in range(1, 65) if not torch.equal(F.linear(x[:, :m], weight, bias)[:, :1], linear)]
        bad_addmm = [m for m in range(1, 65) if not torch.equal(torch.addmm(bias, x[0, :m], weight.t())[:1], addmm)]
        print(f"{str(dtype)[6:]:9} k={k:5} n={n:6} linear row0 differs at M={listed(bad_linear)} "
              f"addmm at M={listed(bad_addmm)}", flush=True)


def attention(dtype: torch.dtype) -> None:
    heads, kv_heads, dim, ctx = 4, 2, 16, 37
    q = torch.randn(8, heads, 1, dim, device=DEVICE, dtype=dtype)
    keys = torch.randn(8, kv_heads, 1024, dim, device=DEVICE, dtype=dtype)
    values = torch.randn(8, kv_heads, 1024, dim, device=DEVICE, dtype=dtype)

    def run(rows: int, width: int, lengths: list[int]) -> torch.Tensor:
        seen = torch.arange(width, device=DEVICE)[None, :] < torch.tensor(lengths, device=DEVICE)[:, None]
        return F.scaled_dot_product_attention(q[:rows], keys[:rows, :, :width], values[:rows, :, :width],
                                              attn_mask=seen[:, None, None, :], enable_gqa=True)[0]
    alone = run(1, 48, [ctx])
    out = []
    for rows in (1, 2, 8):
        for width in (48, 64, 128, 256, 1024):
            lengths = [ctx] + [min(width, 20 + 50 * i) for i in range(1, rows)]
            out.append(f"{rows}x{width}:{'=' if torch.equal(run(rows, width, lengths), alone) else 'DIFF'}")
    print(str(dtype)[6:], "sdpa one query, rows x width:", " ".join(out), flush=True)


if __name__ == "__main__":
    torch.manual_seed(0)
    for dtype in (torch.bfloat16, torch.float32):
        matmuls(dtype)
    for dtype in (torch.bfloat16, torch.float32):
        attention(dtype)
