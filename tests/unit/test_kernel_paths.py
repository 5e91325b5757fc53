"""Every kernel path this CPU builds (testing/golden.py's kernel_paths: the machine's own, AVX2
where it has AVX-512 too, plain C) computes the same bits, kernel by kernel, on inputs that reach
their corners: blocks of zeros, outliers, widths that are not whole blocks or vectors, fp16
subnormals and overflow, -inf logits."""
import ctypes

import pytest
import torch

from tests.unit.test_paged_attention import MIXED, c_args, step


@pytest.fixture(scope="module")
def paths(kernel_libraries) -> dict[str, ctypes.CDLL]:
    if len(kernel_libraries) < 2:
        pytest.skip("this CPU builds one kernel path only")
    return kernel_libraries


def same_on_every_path(paths: dict[str, ctypes.CDLL], run) -> list[torch.Tensor]:
    """run(library) -> tensors, on every path; asserts they are the same bits; the native path's."""
    results = {name: run(library) for name, library in paths.items()}
    native = results.pop("native")
    for name, outs in results.items():
        for a, b in zip(native, outs, strict=True):
            assert torch.equal(a, b), f"the {name} path differs from the native one"
    return native


def activations(rows: int, width: int) -> torch.Tensor:
    x = torch.randn(rows, width, generator=torch.Generator().manual_seed(rows * width))
    x[0, :32] = 0  # a block of zeros
    x[min(1, rows - 1), 5] = 300.0  # an outlier that flattens its block
    return x


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 7, 14, 16, 17, 25, 35])  # every tile's count on every path,
# (25) AVX2's widened groups and (35) AVX-512's int4 tiles of two groups
def test_int4_and_int8_matmuls(paths, rows):
    g = torch.Generator().manual_seed(rows)
    width, outputs = 576, 96
    packed = torch.randint(0, 256, (outputs // 16, width // 32, 16, 16), dtype=torch.uint8, generator=g)
    scale = (torch.rand(outputs // 16, width // 32, 16, generator=g) * 0.01).half()
    low = (-torch.rand(outputs // 16, width // 32, 16, generator=g) * 0.08).half()
    x = activations(rows, width)

    def int4(library):
        y = torch.empty(rows, outputs)
        assert library.int4_matmul(x.data_ptr(), packed.data_ptr(), scale.data_ptr(), low.data_ptr(), y.data_ptr(),
                                   rows, width, outputs, 2) == 0
        return [y]
    same_on_every_path(paths, int4)
    wide_scale, wide_low = scale.float() * 0.37, low.float() * 1.3  # Q4_K's fp32 d sc and dmin m

    def int4f(library):
        y = torch.empty(rows, outputs)
        assert library.int4f_matmul(x.data_ptr(), packed.data_ptr(), wide_scale.data_ptr(), wide_low.data_ptr(),
                                    y.data_ptr(), rows, width, outputs, 2) == 0
        return [y]
    same_on_every_path(paths, int4f)
    steps = torch.randint(-128, 128, (outputs // 16, width, 16), dtype=torch.int8, generator=g)
    sub_scale = torch.rand(outputs // 16, width // 16, 16, generator=g) * 0.01
    sub_low = -torch.rand(outputs // 16, width // 16, 16, generator=g) * 0.05

    def int8s(library):  # Q5_1, Q5_K (with lows) and Q6_K (without)
        ys = [torch.empty(rows, outputs), torch.empty(rows, outputs)]
        for y, lows in zip(ys, (sub_low.data_ptr(), None), strict=True):
            assert library.int8s_matmul(x.data_ptr(), steps.data_ptr(), sub_scale.data_ptr(), lows, y.data_ptr(),
                                        rows, width, outputs, 2) == 0
        return ys
    same_on_every_path(paths, int8s)
    for width8 in (576, 77, 40):
        weights = torch.randint(-128, 128, (outputs // 16, width8, 16), dtype=torch.int8, generator=g)
        scales = (torch.rand(outputs // 16, -(-width8 // 32), 16, generator=g) * 0.01).half()
        x8 = activations(rows, width8)

        def int8(library, weights=weights, scales=scales, x8=x8, width8=width8):
            y = torch.empty(rows, outputs)
            assert library.int8_matmul(x8.data_ptr(), weights.data_ptr(), scales.data_ptr(), y.data_ptr(), rows,
                                       width8, outputs, 2) == 0
            return [y]
        same_on_every_path(paths, int8)


@pytest.mark.parametrize("rows", [1, 2, 3, 8, 17, 25, 32, 38])  # from 32, AVX-512's int4 tiles of two groups
# (48 outputs: a pair of groups, then one alone)
def test_q4_k_and_q6_k_own_scales_give_int4f_and_int8s_bits_on_every_path(paths, rows):
    """int4k_matmul (Q4_K's fp16 d and -dmin per 256, u8 sc and m per 32) and int8k_matmul (Q6_K's
    fp16 d per 256, int8 sc per 16) compute each block's scale and low in fp32, where they are exact:
    the products are int4f_matmul's and int8s_matmul's of those values, bit for bit, on every path
    (fp16 subnormal and largest d among them)."""
    g = torch.Generator().manual_seed(rows + 100)
    width, outputs = 768, 48
    packed = torch.randint(0, 256, (outputs // 16, width // 32, 16, 16), dtype=torch.uint8, generator=g)
    supers = (torch.rand(outputs // 16, width // 256, 2, 16, generator=g) * 0.002).half()
    supers[:, :, 1] = -supers[:, :, 1]  # -dmin
    supers[0, 0, 0, :2] = torch.tensor([6e-8, 65504.0]).half()
    subs = torch.randint(0, 64, (outputs // 16, width // 32, 2, 16), dtype=torch.uint8, generator=g)
    values = supers.float().repeat_interleave(8, dim=1) * subs.float()
    scale, low = values[:, :, 0].contiguous(), values[:, :, 1].contiguous()
    x = activations(rows, width)

    def both(library):
        ys = [torch.empty(rows, outputs), torch.empty(rows, outputs)]
        assert library.int4k_matmul(x.data_ptr(), packed.data_ptr(), supers.data_ptr(), subs.data_ptr(),
                                    ys[0].data_ptr(), rows, width, outputs, 2) == 0
        assert library.int4f_matmul(x.data_ptr(), packed.data_ptr(), scale.data_ptr(), low.data_ptr(),
                                    ys[1].data_ptr(), rows, width, outputs, 2) == 0
        assert torch.equal(ys[0], ys[1])
        return ys
    same_on_every_path(paths, both)
    steps = torch.randint(-32, 32, (outputs // 16, width, 16), dtype=torch.int8, generator=g)
    d = supers[:, :, 0].contiguous()  # fp16 d per 256
    sc = torch.randint(-128, 128, (outputs // 16, width // 16, 16), dtype=torch.int8, generator=g)
    sub_scale = (d.float().repeat_interleave(16, dim=1) * sc.float()).contiguous()

    def q6_k(library):  # int8k_matmul: Q6_K's own scales, against int8s_matmul of the same values
        ys = [torch.empty(rows, outputs), torch.empty(rows, outputs)]
        assert library.int8k_matmul(x.data_ptr(), steps.data_ptr(), d.data_ptr(), sc.data_ptr(), ys[0].data_ptr(),
                                    rows, width, outputs, 2) == 0
        assert library.int8s_matmul(x.data_ptr(), steps.data_ptr(), sub_scale.data_ptr(), None, ys[1].data_ptr(),
                                    rows, width, outputs, 2) == 0
        assert torch.equal(ys[0], ys[1])
        return ys
    same_on_every_path(paths, q6_k)
    y = torch.empty(rows, outputs)
    assert paths["native"].int4k_matmul(x.data_ptr(), packed.data_ptr(), supers.data_ptr(), subs.data_ptr(),
                                        y.data_ptr(), rows, 576, outputs, 2) == -1  # not whole blocks of 256


@pytest.mark.parametrize("rows", [16, 25])  # 16 rows a tile, then 8 and 1
def test_a_streamed_int8_weight_takes_wide_tiles_with_the_same_bits(paths, rows):
    """int8 weights of 8M values or more (quant_matmul.c's STREAMED: an output layer's) take 16 rows
    a tile on AVX-512; a last block that is not whole, on every path."""
    g = torch.Generator().manual_seed(rows)
    width, outputs = 520, 16144  # 8,394,880 values
    weights = torch.randint(-128, 128, (outputs // 16, width, 16), dtype=torch.int8, generator=g)
    scales = (torch.rand(outputs // 16, -(-width // 32), 16, generator=g) * 0.01).half()
    x = activations(rows, width)

    def int8(library):
        y = torch.empty(rows, outputs)
        assert library.int8_matmul(x.data_ptr(), weights.data_ptr(), scales.data_ptr(), y.data_ptr(), rows, width,
                                   outputs, 2) == 0
        return [y]
    native = same_on_every_path(paths, int8)[0]
    alone = torch.cat([_rows_alone(paths["native"], x, weights, scales, r) for r in range(0, rows, 9)])
    assert torch.equal(native[::9], alone)  # a row's outputs whatever tile it shares


def _rows_alone(library: ctypes.CDLL, x: torch.Tensor, weights: torch.Tensor, scales: torch.Tensor,
                row: int) -> torch.Tensor:
    outputs, width = weights.shape[0] * 16, x.shape[1]
    y = torch.empty(1, outputs)
    assert library.int8_matmul(x[row:row + 1].contiguous().data_ptr(), weights.data_ptr(), scales.data_ptr(),
                               y.data_ptr(), 1, width, outputs, 2) == 0
    return y


@pytest.mark.parametrize("cap", [0.0, 2.0], ids=["plain", "softcapped"])
@pytest.mark.parametrize("heads,kv_heads,dim", [(9, 3, 64), (4, 2, 16), (2, 1, 80), (4, 2, 256), (6, 2, 128),
                                                 (10, 2, 128), (12, 2, 128)])  # the last four: AVX-512's widest slices
def test_attention_over_fp32_and_fp16_pools(paths, heads, kv_heads, dim, cap):
    query, k_pool, v_pool, tables, q_lens, ctx_lens = step(MIXED, heads, kv_heads, dim, seed=7)
    starts, lens, ctx, table = c_args(tables, q_lens, ctx_lens)
    q = query.contiguous()  # [1, heads, tokens, dim]: token t's head h at t * dim + h * tokens * dim

    def attend(library):
        outs = []
        for keys, values, function in ((k_pool, v_pool, library.paged_attention),
                                       (k_pool.half(), v_pool.half(), library.paged_attention_f16)):
            out = torch.empty(sum(q_lens), heads, dim)
            assert function(q.data_ptr(), dim, q.shape[2] * dim, keys.data_ptr(), values.data_ptr(), out.data_ptr(),
                            starts.data_ptr(), lens.data_ptr(), ctx.data_ptr(), table.data_ptr(), table.shape[1],
                            table.shape[0], heads, kv_heads, dim, k_pool.shape[-1], 0, dim ** -0.5, cap, 2) == 0
            outs.append(out)
        return outs
    same_on_every_path(paths, attend)


def test_norms_activations_greedy_and_log_softmax(paths):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, 576, generator=g) * 3
    weight = torch.rand(576, generator=g)
    logits = torch.randn(6, 1003, generator=g) * 6
    logits[2, ::3] = float("-inf")  # what a constraint forbids

    def small_ops(library):
        norm, act, lsm, gelu = torch.empty_like(x), torch.empty(5, 573), torch.empty_like(logits), torch.empty(2877)
        library.rms_norm_rows(x.data_ptr(), weight.data_ptr(), norm.data_ptr(), 5, 576, ctypes.c_float(1e-5))
        library.silu_rows(x.data_ptr(), act.data_ptr(), 5, 573, 576)  # rows not whole vectors
        library.gelu_tanh_rows(x.data_ptr(), gelu.data_ptr(), 2877)  # not whole vectors
        assert library.log_softmax_rows(logits.data_ptr(), 6, 1003, lsm.data_ptr(), 2) == 0
        tokens, logprobs = torch.empty(6, dtype=torch.int64), torch.empty(6)
        assert library.greedy_rows(logits.data_ptr(), 6, 1003, tokens.data_ptr(), logprobs.data_ptr(), 2) == 0
        return [norm, act, lsm, tokens, logprobs, gelu]
    norm, act, lsm, tokens, logprobs, gelu = same_on_every_path(paths, small_ops)
    # GELU's tanh approximation in arith.h's tanh: PyTorch's within float rounding
    torch.testing.assert_close(gelu, torch.nn.functional.gelu(x.flatten()[:2877], approximate="tanh"),
                               atol=1e-6, rtol=1e-6)
    assert torch.equal(tokens, logits.argmax(-1)) and torch.equal(logprobs, lsm.gather(1, tokens[:, None])[:, 0])
    assert torch.isinf(lsm[2, ::3]).all()


def test_fp16_rounding_is_pytorchs_on_every_path(paths):
    """Every fp16 value's neighbourhood (subnormals, the largest finite values and overflow, ties
    to even) rounds as PyTorch's .half() does, with F16C and without."""
    halves = torch.arange(0, 1 << 16, dtype=torch.int32).to(torch.int16).view(torch.float16)
    finite = halves[torch.isfinite(halves)].float()
    ulp = torch.finfo(torch.float32).eps
    x = torch.cat([finite, finite * (1 + ulp), finite * (1 - ulp), (finite[1:] + finite[:-1]) / 2,
                   torch.tensor([65504.0, 65519.0, 65520.0, 1e6, -1e6, 2.0 ** -25, 2.0 ** -26, 3e-8])])

    def rounded(library):
        out = torch.empty(x.numel(), dtype=torch.int16)
        library.fp16_rows(x.data_ptr(), out.data_ptr(), x.numel())
        return [out]
    [bits] = same_on_every_path(paths, rounded)
    assert torch.equal(bits, x.half().view(torch.int16))
