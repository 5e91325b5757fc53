"""Row 0 of a matmul, alone and with M-1 other rows, bit for bit (bf16 and fp32, the test and
benchmark models' shapes); then one query's SDPA over keys padded (masked) to several widths,
alone and batched. Prints where they differ."""
import torch, torch.nn.functional as F
torch.manual_seed(0)
dev = "cuda"
for dtype in (torch.bfloat16, torch.float32):
    for k, n in ((64, 64), (64, 2000), (64, 256), (768, 768), (768, 2304), (768, 3072), (3072, 768), (768, 50257),
                 (2048, 2048), (2048, 5632), (2048, 32000)):
        W = torch.randn(n, k, device=dev, dtype=dtype) / k ** 0.5
        b = torch.randn(n, device=dev, dtype=dtype)
        x = torch.randn(1, 64, k, device=dev, dtype=dtype)
        lin1 = F.linear(x[:, :1], W, b)
        add1 = torch.addmm(b, x[0, :1], W.t())
        bad_lin = [M for M in range(1, 65) if not torch.equal(F.linear(x[:, :M], W, b)[:, :1], lin1)]
        bad_add = [M for M in range(1, 65) if not torch.equal(torch.addmm(b, x[0, :M], W.t())[:1], add1)]
        print(f"{str(dtype)[6:]:9} k={k:5} n={n:6} linear row0 differs at M={bad_lin[:12]}{'...' if len(bad_lin) > 12 else ''} "
              f"addmm at M={bad_add[:12]}{'...' if len(bad_add) > 12 else ''}", flush=True)
# SDPA: one query over ctx keys, widths padded (masked) and batches of other rows
for dtype in (torch.bfloat16, torch.float32):
    heads, kvh, d = 4, 2, 16
    ctx = 37
    q = torch.randn(8, heads, 1, d, device=dev, dtype=dtype)
    kk = torch.randn(8, kvh, 1024, d, device=dev, dtype=dtype)
    vv = torch.randn(8, kvh, 1024, d, device=dev, dtype=dtype)
    def run(rows, width, ctxs):
        m = (torch.arange(width, device=dev)[None, :] < torch.tensor(ctxs, device=dev)[:, None])[:, None, None, :]
        return F.scaled_dot_product_attention(q[:rows], kk[:rows, :, :width], vv[:rows, :, :width], attn_mask=m,
                                              enable_gqa=True)[0]
    ref = run(1, 48, [ctx])
    out = []
    for rows in (1, 2, 8):
        for width in (48, 64, 128, 256, 1024):
            ctxs = [ctx] + [min(width, 20 + 50 * i) for i in range(1, rows)]
            out.append(f"{rows}x{width}:{'=' if torch.equal(run(rows, width, ctxs), ref) else 'DIFF'}")
    print(str(dtype)[6:], "sdpa one query, rows x width:", " ".join(out), flush=True)
