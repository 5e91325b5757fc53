"""Attention through block tables (paged_attention.c, and paged_attention.py's PyTorch paths):
SDPA's results over each sequence's own keys, a query's bits whatever its step holds (alone,
batched, in a whole prefill or a chunk after cached keys), sliding windows, Gemma 2's cap on the
scores, and the fallbacks where the kernel cannot be built or does not fit."""
import logging
import random
import shutil

import pytest
import torch
import torch.nn.functional as F

from engine.core.kv_pool import KVPool, KVShape
from engine.kernels import build, native
from engine.kernels.table import Op, choose
from engine.model import paged_attention


@pytest.fixture(scope="module")
def built():
    if native.library() is None:
        pytest.skip("no C compiler on this machine: the engine uses its per-sequence SDPA fallback")


def step(seqs: list[tuple[int, int]], heads: int, kv_heads: int, dim: int, block: int = 16, seed: int = 0):
    """Sequences (keys, new queries) over a pool whose blocks are handed out in a random order,
    keys transposed within a block as the pool keeps them; queries packed as transformers passes
    them ([1, heads, tokens, dim], a transposed view)."""
    g = torch.Generator().manual_seed(seed)
    need = sum(-(-ctx // block) for ctx, _ in seqs)
    k_rows, v_pool = torch.randn(2, need + 3, block, kv_heads, dim, generator=g)
    k_pool = k_rows.permute(0, 2, 3, 1).contiguous()  # [blocks, kv_heads, dim, block]
    order = list(range(1, need + 3))
    random.Random(seed).shuffle(order)
    tables = []
    for ctx, _ in seqs:
        tables.append(order[:-(-ctx // block)])
        order = order[-(-ctx // block):]
    tokens = sum(q for _, q in seqs)
    query = torch.randn(1, tokens, heads, dim, generator=g).transpose(1, 2)
    return query, k_pool, v_pool, tables, [q for _, q in seqs], [ctx for ctx, _ in seqs]


def c_args(tables, q_lens, ctx_lens):
    width = max(len(t) for t in tables)
    packed = torch.zeros((len(tables), width), dtype=torch.int32)
    for row, table in enumerate(tables):
        packed[row, :len(table)] = torch.tensor(table, dtype=torch.int32)
    starts = [sum(q_lens[:i]) for i in range(len(q_lens))]
    return torch.tensor(starts), torch.tensor(q_lens), torch.tensor(ctx_lens), packed


def reference(query, k_pool, v_pool, tables, q_lens, ctx_lens, scale, window=0, cap=0.0):
    """SDPA over each sequence's keys, gathered in order; query i at position ctx - q + i. With
    a cap, the scores written out in float64: cap * tanh(scores / cap), masked, softmaxed."""
    out, at = [], 0
    k_pool = k_pool.permute(0, 3, 1, 2)  # rows again: [blocks, block, kv_heads, dim]
    for table, q, ctx in zip(tables, q_lens, ctx_lens, strict=True):
        keys = k_pool[table].flatten(0, 1)[:ctx].transpose(0, 1)[None]
        values = v_pool[table].flatten(0, 1)[:ctx].transpose(0, 1)[None]
        positions = torch.arange(ctx - q, ctx)[:, None]
        mask = torch.arange(ctx) <= positions
        if window:
            mask &= torch.arange(ctx) > positions - window
        if cap:
            group = query.shape[1] // keys.shape[1]
            scores = query[:, :, at:at + q].double() @ keys.double().repeat_interleave(group, 1).transpose(-1, -2)
            scores = (torch.tanh(scores * scale / cap) * cap).masked_fill(~mask, float("-inf"))
            o = (torch.softmax(scores, -1) @ values.double().repeat_interleave(group, 1)).float()
        else:
            o = F.scaled_dot_product_attention(query[:, :, at:at + q], keys, values, attn_mask=mask, scale=scale,
                                               enable_gqa=True)
        out.append(o[0].transpose(0, 1))
        at += q
    return torch.cat(out)


MIXED = [(37, 1), (130, 1), (1, 1), (40, 40), (70, 23), (16, 16), (200, 1), (33, 5)]  # decode, prefill, chunks


@pytest.mark.parametrize("heads,kv_heads,dim", [(9, 3, 64), (4, 2, 16), (8, 8, 128), (2, 1, 80), (12, 2, 128),
                                                (10, 2, 32), (7, 1, 64), (16, 2, 64), (9, 1, 16)])
def test_it_gives_what_sdpa_gives_over_each_sequences_own_keys(built, heads, kv_heads, dim):
    query, k_pool, v_pool, tables, q_lens, ctx_lens = step(MIXED, heads, kv_heads, dim)
    out = native.paged_attention(query, k_pool, v_pool, c_args(tables, q_lens, ctx_lens), dim ** -0.5, 0)
    assert out is not None and out.shape == (sum(q_lens), heads, dim)
    expected = reference(query, k_pool, v_pool, tables, q_lens, ctx_lens, dim ** -0.5)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("heads,kv_heads", [(9, 3), (12, 2), (14, 2)])  # groups of 3, 6 (Qwen 2.5 1.5B) and 7
@pytest.mark.parametrize("threads", [1, 2])
def test_a_sequence_comes_out_bit_for_bit_as_alone_whatever_the_step(built, threads, heads, kv_heads):
    seqs = MIXED + [(600, 1), (600, 64)]  # wide enough to run on both threads
    query, k_pool, v_pool, tables, q_lens, ctx_lens = step(seqs, heads, kv_heads, 64, seed=1)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        together = native.paged_attention(query, k_pool, v_pool, c_args(tables, q_lens, ctx_lens), 0.125, 0)
        assert together is not None
        at = 0
        for s, q in enumerate(q_lens):
            alone = native.paged_attention(query[:, :, at:at + q], k_pool, v_pool,
                                           c_args(tables[s:s + 1], [q], ctx_lens[s:s + 1]), 0.125, 0)
            assert alone is not None and torch.equal(alone, together[at:at + q]), s
            at += q
    finally:
        torch.set_num_threads(before)


def test_a_prompt_in_chunks_after_cached_keys_equals_the_whole_prompt(built):
    """What prefix caching and chunked prefill rest on: the same query over the same keys,
    whether the keys before it came in this step or an earlier one."""
    query, k_pool, v_pool, tables, q_lens, ctx_lens = step([(100, 100)], 9, 3, 64, seed=2)
    whole = native.paged_attention(query, k_pool, v_pool, c_args(tables, [100], [100]), 0.125, 0)
    for cut in (1, 16, 48, 99):
        first = native.paged_attention(query[:, :, :cut], k_pool, v_pool, c_args(tables, [cut], [cut]), 0.125, 0)
        rest = native.paged_attention(query[:, :, cut:], k_pool, v_pool, c_args(tables, [100 - cut], [100]), 0.125, 0)
        assert first is not None and rest is not None and whole is not None
        assert torch.equal(torch.cat([first, rest]), whole), cut


def test_a_sliding_window_limits_each_query_to_its_last_keys(built):
    query, k_pool, v_pool, tables, q_lens, ctx_lens = step(MIXED, 4, 2, 32, seed=3)
    out = native.paged_attention(query, k_pool, v_pool, c_args(tables, q_lens, ctx_lens), 0.2, 24)
    torch.testing.assert_close(out, reference(query, k_pool, v_pool, tables, q_lens, ctx_lens, 0.2, 24),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("window", [0, 24])
def test_a_cap_on_the_scores_is_gemma_2s_softcapping(built, window):
    """scores -> cap * tanh(scores / cap) before the softmax, arith.h's tanh8 within float
    rounding of float64's; a capped query is still the same bits alone and batched."""
    query, k_pool, v_pool, tables, q_lens, ctx_lens = step(MIXED, 6, 2, 32, seed=5)
    query = query * 8  # scores of several units: the cap bends them
    out = native.paged_attention(query, k_pool, v_pool, c_args(tables, q_lens, ctx_lens), 0.2, window, 3.0)
    expected = reference(query, k_pool, v_pool, tables, q_lens, ctx_lens, 0.2, window, cap=3.0)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=2e-6)
    uncapped = reference(query, k_pool, v_pool, tables, q_lens, ctx_lens, 0.2, window)
    assert (uncapped - expected).abs().max() > 0.1  # the cap changes these numbers: the test can fail
    at = 0
    for s, q in enumerate(q_lens):
        alone = native.paged_attention(query[:, :, at:at + q], k_pool, v_pool,
                                       c_args(tables[s:s + 1], [q], ctx_lens[s:s + 1]), 0.2, window, 3.0)
        assert alone is not None and torch.equal(alone, out[at:at + q]), s
        at += q


def test_what_it_does_not_take_is_left_to_pytorch(built):
    query, k_pool, v_pool, tables, q_lens, ctx_lens = step([(5, 1), (9, 2)], 4, 2, 20)  # dim not a multiple of 8
    assert native.paged_attention(query, k_pool, v_pool, c_args(tables, q_lens, ctx_lens), 0.2, 0) is None
    query, k_pool, v_pool, tables, q_lens, ctx_lens = step([(5, 1), (9, 2)], 4, 2, 32)
    args = c_args(tables, q_lens, ctx_lens)
    assert native.paged_attention(query.double(), k_pool.double(), v_pool.double(), args, 0.2, 0) is None
    assert native.paged_attention(query, k_pool, v_pool, c_args(tables, q_lens, [5, 1]), 0.2, 0) is None  # 2 > 1


class Layer(torch.nn.Module):
    layer_idx = 0


@pytest.mark.parametrize("cap", [0.0, 2.0], ids=["plain", "softcapped"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("path", ["c", "per_sequence", "padded"])
def test_every_path_writes_the_new_keys_then_attends_as_sdpa(monkeypatch, path, dtype, cap):
    """paged_attention as transformers' layers call it: this step's keys and values go into
    their slots (rounded to the pool's dtype), then each sequence attends over all its keys. The
    C kernel, one SDPA call per sequence (CPU without the kernel), and one padded SDPA call
    (CUDA's) agree, over an fp32 pool and an fp16 one."""
    if path == "c" and (native.library() is None or (dtype == torch.float16 and not native.kv_half_ready())):
        pytest.skip("no C kernel for this pool here")
    if path != "c":
        monkeypatch.setattr(paged_attention, "c_paged_attention", lambda *args: None)
    if path == "padded":
        monkeypatch.setattr(paged_attention, "_per_sequence", paged_attention._padded)
    heads, kv_heads, dim = 6, 2, 32
    query, k_pool, v_pool, tables, q_lens, ctx_lens = step(MIXED, heads, kv_heads, dim, seed=4)
    k_pool, v_pool = k_pool.to(dtype), v_pool.to(dtype)
    pool = KVPool(KVShape(1, kv_heads, dim, dtype), k_pool.shape[0] - 1, torch.device("cpu"))
    pool.keys[0], pool.values[0] = k_pool, v_pool
    slots = [t[p // 16] * 16 + p % 16 for t, q, ctx in zip(tables, q_lens, ctx_lens, strict=True)
             for p in range(ctx - q, ctx)]
    new_k, new_v = torch.randn(2, 1, kv_heads, len(slots), dim)
    paged = paged_attention.PagedStep(pool, torch.tensor(slots), q_lens, ctx_lens, tables)
    out, _ = paged_attention.paged_attention(Layer(), query, new_k, new_v, None, scaling=0.3, paged=paged,
                                             softcap=cap or None)
    rows = k_pool.permute(0, 3, 1, 2).reshape(-1, kv_heads, dim).float(), v_pool.reshape(-1, kv_heads, dim).float()
    rows[0][slots], rows[1][slots] = (new[0].transpose(0, 1).to(dtype).float() for new in (new_k, new_v))
    expected = reference(query, rows[0].view(-1, 16, kv_heads, dim).permute(0, 2, 3, 1), rows[1].view_as(v_pool),
                         tables, q_lens, ctx_lens, 0.3, cap=cap)
    torch.testing.assert_close(out[0], expected, rtol=1e-5, atol=1e-5)
    assert paged.counted == [0] and pool.keys.dtype == dtype


@pytest.mark.parametrize("compiler", ["false", "/no/such/cc"])
def test_a_build_that_fails_leaves_the_fallback_and_says_why(monkeypatch, caplog, compiler):
    build._built.cache_clear()
    monkeypatch.setenv("CC", compiler)
    try:
        assert native.library() is None
        query, k_pool, v_pool, tables, q_lens, ctx_lens = step([(3, 1)], 4, 2, 16)
        assert native.paged_attention(query, k_pool, v_pool, c_args(tables, q_lens, ctx_lens), 0.25, 0) is None
        kernel = choose(Op.INT4_MATMUL, "int4")  # the table says why it falls back
        assert not kernel.c and "not built" in kernel.why and compiler in kernel.why, kernel
    finally:
        build._built.cache_clear()  # the next caller builds with the real compiler again
    assert "C kernels not built" in caplog.text


def few_sources(monkeypatch, *names: str) -> None:
    """Builds of only these sources (quick), bound as far as they go: for what a build does with
    its library, whatever it holds."""
    real = build.bind
    monkeypatch.setattr(build, "SOURCES", tuple(build.HERE / name for name in names))
    monkeypatch.setattr(build, "bind", lambda library: real(library, missing_ok=True))


def test_the_built_kernels_are_kept_for_the_next_process_on_this_cpu(monkeypatch, caplog, tmp_path):
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler")
    few_sources(monkeypatch, "greedy.c")
    monkeypatch.setenv("LLM_KERNEL_CACHE", str(tmp_path))
    caplog.set_level(logging.INFO, logger=build.__name__)
    try:
        for _ in range(2):  # built, then loaded as another process would
            build._built.cache_clear()
            assert native.library() is not None
        kept = list(tmp_path.glob("kernels-*.so"))
        assert len(kept) == 1 and "C kernels loaded from" in caplog.text
        monkeypatch.setattr(build, "_cpu_identity", lambda: "another CPU")
        build._built.cache_clear()
        assert native.library() is not None and len(list(tmp_path.glob("kernels-*.so"))) == 2  # built for it
    finally:
        build._built.cache_clear()


def test_the_operators_kernel_flags_build_a_library_of_their_own(monkeypatch, tmp_path):
    """`LLM_KERNEL_FLAGS` go after the engine's: here they take every vector extension away, so the
    dense matmul builds its plain C version (it says 0 where AVX2 is missing), and the build is kept
    under a key of its own. (The quantized kernels' plain C path: test_kernel_paths.py.)"""
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler")
    few_sources(monkeypatch, "dense_matmul.c")
    monkeypatch.setenv("LLM_KERNEL_CACHE", str(tmp_path))
    try:
        build._built.cache_clear()
        assert native.library() is not None
        monkeypatch.setenv("LLM_KERNEL_FLAGS", build.PORTABLE)
        build._built.cache_clear()
        narrow = native.library()
        assert narrow is not None and narrow.dense_matmul_ready() == 0
        assert len(list(tmp_path.glob("kernels-*.so"))) == 2
    finally:
        build._built.cache_clear()
