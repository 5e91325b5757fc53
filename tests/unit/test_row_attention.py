"""The C row attention (row_attention.c, built by native.py): SDPA's results in decode steps and
in prefills, a row's bits whatever its batch, and the per-row SDPA fallback where it cannot be
built or does not fit."""
import pytest
import torch
import torch.nn.functional as F

from executors.engine import attention, native


@pytest.fixture(scope="module", autouse=True)
def built():
    if native.library() is None:
        pytest.skip("no C compiler on this machine: the engine uses its per-row SDPA fallback")


def batch(lengths: list[int], heads: int, kv_heads: int, dim: int, seed: int = 0):
    """One decode query per row; keys left-padded with zeros to the longest, as KVBatch keeps them,
    inside a wider slab (non-contiguous views, as the cache passes them)."""
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    query = torch.randn(len(lengths), heads, 1, dim, generator=g)
    slab_k = torch.zeros(len(lengths), kv_heads, width + 7, dim)
    slab_v = torch.zeros_like(slab_k)
    for row, n in enumerate(lengths):
        slab_k[row, :, width - n:width] = torch.randn(kv_heads, n, dim, generator=g)
        slab_v[row, :, width - n:width] = torch.randn(kv_heads, n, dim, generator=g)
    return query, slab_k[:, :, :width], slab_v[:, :, :width], [width - n for n in lengths]


@pytest.mark.parametrize("heads,kv_heads,dim", [(9, 3, 64), (4, 2, 16), (8, 8, 128), (2, 1, 80)])
def test_it_gives_what_sdpa_gives_over_each_rows_own_keys(heads, kv_heads, dim):
    query, key, value, starts = batch([5, 130, 1, 64, 17], heads, kv_heads, dim)
    out = native.row_attention(query, key, value, starts, [0] * len(starts), dim ** -0.5)
    assert out is not None and out.shape == (5, 1, heads, dim)
    for row, start in enumerate(starts):
        expected = F.scaled_dot_product_attention(query[row:row + 1], key[row:row + 1, :, start:],
                                                  value[row:row + 1, :, start:], enable_gqa=True)
        torch.testing.assert_close(out[row:row + 1], expected.transpose(1, 2), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_row_comes_out_bit_for_bit_as_alone_whatever_the_batch(threads):
    lengths = [3, 200, 41, 600, 77, 1, 130, 16]  # 600: wide enough to run on both threads
    query, key, value, starts = batch(lengths, 9, 3, 64, seed=1)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        together = native.row_attention(query, key, value, starts, [0] * len(starts), 0.125)
        assert together is not None
        for row, start in enumerate(starts):
            alone = native.row_attention(query[row:row + 1], key[row:row + 1, :, start:],
                                         value[row:row + 1, :, start:], [0], [0], 0.125)
            assert alone is not None and torch.equal(alone, together[row:row + 1]), row
    finally:
        torch.set_num_threads(before)


def test_what_it_does_not_take_is_left_to_sdpa():
    query, key, value, starts = batch([4, 6], 4, 2, 24)  # a head dim that is not a multiple of 16
    assert native.row_attention(query, key, value, starts, [0, 0], 0.2) is None
    query, key, value, starts = batch([4, 6], 4, 2, 32)
    assert native.row_attention(query.double(), key.double(), value.double(), starts, [0, 0], 0.2) is None
    assert native.row_attention(query, key, value, [0, 6], [0, 0], 0.2) is None  # a row with no key
    long = query.expand(2, 4, 7, 32)  # 7 queries over 6 keys: the first would have none
    assert native.row_attention(long, key, value, [0, 0], [0, 0], 0.2) is None


def prefill(lengths: list[int], heads: int, kv_heads: int, dim: int, seed: int = 0):
    """Left-padded prompts, as prefill_group runs them: queries and keys both `max(lengths)` long."""
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    query = torch.randn(len(lengths), heads, width, dim, generator=g)
    key, value = torch.randn(2, len(lengths), kv_heads, width, dim, generator=g)
    return query, key, value, [width - n for n in lengths]


@pytest.mark.parametrize("heads,kv_heads,dim", [(9, 3, 64), (4, 2, 16)])
def test_a_prefill_gives_what_causal_sdpa_gives_over_each_rows_own_prompt(heads, kv_heads, dim):
    query, key, value, starts = prefill([5, 40, 1, 23], heads, kv_heads, dim)
    out = native.row_attention(query, key, value, starts, starts, dim ** -0.5)
    assert out is not None
    for row, start in enumerate(starts):
        expected = F.scaled_dot_product_attention(query[row:row + 1, :, start:], key[row:row + 1, :, start:],
                                                  value[row:row + 1, :, start:], is_causal=True, enable_gqa=True)
        torch.testing.assert_close(out[row:row + 1, start:], expected.transpose(1, 2), rtol=1e-5, atol=1e-6)
        assert not out[row, :start].any()  # the padding's queries stay zero, as with SDPA per row


def test_a_prefilled_row_comes_out_bit_for_bit_as_alone():
    query, key, value, starts = prefill([5, 40, 1, 23, 33], 9, 3, 64, seed=2)
    together = native.row_attention(query, key, value, starts, starts, 0.125)
    assert together is not None
    for row, start in enumerate(starts):
        cut = (slice(row, row + 1), slice(None), slice(start, None))
        alone = native.row_attention(query[cut], key[cut], value[cut], [0], [0], 0.125)
        assert alone is not None and torch.equal(alone, together[row:row + 1, start:]), row


@pytest.mark.parametrize("step", ["decode", "prefill"])
def test_row_sdpa_falls_back_to_one_sdpa_call_per_row(monkeypatch, step):
    """The masks transformers passes (left padding; causal in a prefill): the kernel's answer,
    and without it SDPA's, row by row."""
    make = batch if step == "decode" else prefill
    query, key, value, starts = make([3, 9, 6], 4, 2, 16)
    q_len, width = query.shape[2], key.shape[2]
    keys, queries = torch.arange(width), torch.arange(width - q_len, width)[:, None]
    mask = torch.stack([(keys >= start) & (keys <= queries) for start in starts])[:, None]
    answers = []
    monkeypatch.setattr(attention, "row_attention", lambda *args: answers.append(native.row_attention(*args))
                        or answers[-1])
    kernel_out, _ = attention.row_sdpa(torch.nn.Module(), query, key, value, mask, scaling=0.25)
    assert len(answers) == 1 and answers[0] is not None  # the kernel took these masks
    monkeypatch.setattr(native, "library", lambda: None)
    sdpa_out, _ = attention.row_sdpa(torch.nn.Module(), query, key, value, mask.clone(), scaling=0.25)
    torch.testing.assert_close(kernel_out, sdpa_out, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("compiler", ["false", "/no/such/cc"])
def test_a_build_that_fails_leaves_the_fallback_and_says_why(monkeypatch, caplog, compiler):
    native.library.cache_clear()
    monkeypatch.setenv("CC", compiler)
    try:
        assert native.library() is None
        query, key, value, starts = batch([2, 3], 4, 2, 16)
        assert native.row_attention(query, key, value, starts, [0, 0], 0.25) is None
    finally:
        native.library.cache_clear()  # the next caller builds with the real compiler again
    assert "C kernels not built" in caplog.text
