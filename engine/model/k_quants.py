"""ggml's Q4_K and Q6_K quantizers (`quantize_row_q4_K_ref`, `quantize_row_q6_K_ref` in
ggml-quants.c), which the `gguf` package does not have, written over numpy arrays of many blocks
at once.

Why: Q4_K_M, the type most GGUF files are published in, mixes Q4_K and Q6_K tensors. A Hugging Face
folder quantized here as q4_k_m must hold the blocks llama.cpp's `llama-quantize` writes for it, so
that it runs as that file runs, with the same bits.

They are the reference loops, step for step, in fp32: each sum goes left to right, each product
and sum rounds to fp32 as the C code's do, and `_nearest` rounds halves to even as ggml's
nearest_int does. On a 1.17B Llama-shaped folder, every Q4_K and Q6_K tensor equals llama-quantize's
byte for byte (`python -m benchmarks folder --quant Q4_K_M` checks it).
"""
import numpy as np

F32 = np.float32
_EPS = F32(1e-15)  # ggml's GROUP_MAX_EPS


def _nearest(values: np.ndarray) -> np.ndarray:
    return np.rint(values.astype(F32, copy=False)).astype(np.int32)


def _sum(terms: np.ndarray) -> np.ndarray:
    """Each column's terms (terms [n, rows]: one row of a block per line) summed top to bottom in
    fp32, as a C loop sums them: one vector add per term, so the order is the loop's."""
    total = terms[0].astype(F32, copy=True)
    for term in terms[1:]:
        total += term
    return total


def _scale_and_min(x: np.ndarray, w: np.ndarray, nmax: int, rmin: float, rdelta: float,
                   nstep: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ggml's make_qkx2_quants for blocks x [n, blocks] (one block per column) with weights w:
    (scale, -min, steps 0..nmax [n, blocks]) per block."""
    low, high = np.minimum(x.min(axis=0), F32(0)), x.max(axis=0)
    flat = high == low
    sum_w, sum_x = _sum(w), _sum(w * x)
    width = np.where(flat, F32(1), high - low)
    inverse = F32(nmax) / width
    scale = F32(1) / inverse
    steps = np.clip(_nearest(inverse * (x - low)), 0, nmax)
    diff = (scale * steps.astype(F32) + low) - x
    best = _sum(w * (diff * diff))
    for step in range(nstep + 1):
        width = np.where(flat, F32(1), high - low)  # `low` moves where a step did better
        trial = ((F32(rmin) + F32(rdelta) * F32(step)) + F32(nmax)) / width
        aux = np.clip(_nearest(trial * (x - low)), 0, nmax)
        aux_f = aux.astype(F32)
        wl = w * aux_f
        sum_l, sum_l2, sum_xl = _sum(wl), _sum(wl * aux_f), _sum(wl * x)
        det = sum_w * sum_l2 - sum_l * sum_l
        with np.errstate(divide="ignore", invalid="ignore"):
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / det
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det
            positive = this_min > 0
            this_scale = np.where(positive, sum_xl / sum_l2, this_scale)
            this_min = np.where(positive, F32(0), this_min)
            diff = (this_scale * aux_f + this_min) - x
            error = _sum(w * (diff * diff))
        better = (det > 0) & (error < best) & ~flat
        steps = np.where(better, aux, steps)
        best, scale, low = np.where(better, error, best), np.where(better, this_scale, scale), \
            np.where(better, this_min, low)
    return np.where(flat, F32(0), scale), -low, np.where(flat, 0, steps)


def q4_k(weights: np.ndarray) -> np.ndarray:
    """Q4_K blocks [rows, width / 256 * 144] of fp32 weights [rows, width] (width: whole blocks of 256)."""
    rows = weights.shape[0]
    x = weights.astype(F32, copy=False).reshape(-1, 8, 32)
    blocks = x.shape[0]
    flat = np.ascontiguousarray(x.reshape(-1, 32).T)  # [32, sub-blocks]: each sum one vector add per term
    spread = np.sqrt(_sum(flat * flat) / F32(32))
    scales, mins, steps = _scale_and_min(flat, spread + np.abs(flat), 15, -1.0, 0.1, 20)
    scales, mins, steps = scales.reshape(blocks, 8), mins.reshape(blocks, 8), steps.T.reshape(blocks, 8, 32)
    top_scale, top_min = np.maximum(scales.max(axis=1), F32(0)), np.maximum(mins.max(axis=1), F32(0))
    with np.errstate(divide="ignore"):
        inv_scale = np.where(top_scale > 0, (F32(63) / top_scale).astype(F32, copy=False), F32(0))
        inv_min = np.where(top_min > 0, (F32(63) / top_min).astype(F32, copy=False), F32(0))
    ls = np.minimum(63, _nearest((inv_scale[:, None] * scales).astype(F32, copy=False)) & 0xFF).astype(np.uint8)
    lm = np.minimum(63, _nearest((inv_min[:, None] * mins).astype(F32, copy=False)) & 0xFF).astype(np.uint8)
    d, dmin = (top_scale / F32(63)).astype(F32, copy=False).astype(np.float16), (top_min / F32(63)).astype(F32, copy=False).astype(np.float16)
    step = (d.astype(F32, copy=False)[:, None] * ls.astype(F32, copy=False)).astype(F32, copy=False)
    offset = (dmin.astype(F32, copy=False)[:, None] * lm.astype(F32, copy=False)).astype(F32, copy=False)
    with np.errstate(divide="ignore", invalid="ignore"):
        again = np.clip(_nearest(((x + offset[..., None]).astype(F32, copy=False) / step[..., None]).astype(F32, copy=False)), 0, 15)
    steps = np.where((step != 0)[..., None], again, steps).reshape(blocks, 256).astype(np.uint8)
    packed = np.zeros((blocks, 12), np.uint8)
    packed[:, 0:4], packed[:, 4:8] = ls[:, 0:4], lm[:, 0:4]
    packed[:, 8:12] = (ls[:, 4:8] & 0xF) | ((lm[:, 4:8] & 0xF) << 4)
    packed[:, 0:4] |= (ls[:, 4:8] >> 4) << 6
    packed[:, 4:8] |= (lm[:, 4:8] >> 4) << 6
    quads = [steps[:, j:j + 32] | (steps[:, j + 32:j + 64] << 4) for j in range(0, 256, 64)]
    out = np.concatenate([d.view(np.uint8).reshape(blocks, 2), dmin.view(np.uint8).reshape(blocks, 2), packed, *quads],
                         axis=1)
    return out.reshape(rows, -1)


def _signed_scale(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """ggml's make_qx_quants with rmse_type 1 and no importance, for blocks x [n, blocks] (one block
    per column): (scale, steps 0..2 nmax - 1 [n, blocks]) per block."""
    at = np.arange(x.shape[1])
    largest = np.argmax(np.abs(x), axis=0)  # the first of equal magnitudes, as the C loop keeps it
    top = x[largest, at]
    zero = np.abs(top) < _EPS
    top = np.where(zero, F32(1), top)
    w = x * x
    wx = w * x

    def sums(inverse: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        steps = np.clip(_nearest(inverse * x), -nmax, nmax - 1)
        steps_f = steps.astype(F32)
        return steps, _sum(wx * steps_f), _sum((w * steps_f) * steps_f)

    steps, sum_lx, sum_l2 = sums(F32(-nmax) / top)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(sum_l2 != 0, sum_lx / sum_l2, F32(0))
    best = scale * sum_lx
    for step in (*range(-9, 0), *range(1, 10)):
        aux, lx, l2 = sums(-(F32(nmax) + F32(0.1) * F32(step)) / top)
        better = (l2 > 0) & (lx * lx > best * l2)
        with np.errstate(divide="ignore", invalid="ignore"):
            trial_scale = lx / l2
        steps = np.where(better, aux, steps)
        scale = np.where(better, trial_scale, scale)
        best = np.where(better, trial_scale * lx, best)
    return np.where(zero, F32(0), scale), np.where(zero, 0, steps + nmax)


def q6_k(weights: np.ndarray) -> np.ndarray:
    """Q6_K blocks [rows, width / 256 * 210] of fp32 weights [rows, width] (width: whole blocks of 256)."""
    rows = weights.shape[0]
    x = weights.astype(F32, copy=False).reshape(-1, 16, 16)
    blocks = x.shape[0]
    scales, steps = _signed_scale(np.ascontiguousarray(x.reshape(-1, 16).T), 32)
    scales, steps = scales.reshape(blocks, 16), steps.T.reshape(blocks, 16, 16)
    at = np.arange(blocks)
    largest = np.argmax(np.abs(scales), axis=1)
    top, zero = scales[at, largest], np.abs(scales[at, largest]) < _EPS
    inverse = (F32(-128) / np.where(zero, F32(1), top)).astype(F32, copy=False)
    d = (F32(1) / inverse).astype(F32, copy=False).astype(np.float16)
    small = np.minimum(127, _nearest((inverse[:, None] * scales).astype(F32, copy=False))).astype(np.int8)
    step = (d.astype(F32, copy=False)[:, None] * small.astype(F32, copy=False)).astype(F32, copy=False)
    with np.errstate(divide="ignore", invalid="ignore"):
        again = np.clip(_nearest((x / step[..., None]).astype(F32, copy=False)), -32, 31) + 32
    q = np.where((step != 0)[..., None], again, steps).reshape(blocks, 256).astype(np.uint8)
    low, high = np.zeros((blocks, 128), np.uint8), np.zeros((blocks, 64), np.uint8)
    for half, j in enumerate((0, 128)):
        parts = [q[:, j + 32 * k:j + 32 * k + 32] for k in range(4)]
        low[:, 64 * half:64 * half + 32] = (parts[0] & 0xF) | ((parts[2] & 0xF) << 4)
        low[:, 64 * half + 32:64 * half + 64] = (parts[1] & 0xF) | ((parts[3] & 0xF) << 4)
        high[:, 32 * half:32 * half + 32] = (parts[0] >> 4) | ((parts[1] >> 4) << 2) | ((parts[2] >> 4) << 4) | \
            ((parts[3] >> 4) << 6)
    out = np.concatenate([low, high, small.view(np.uint8), d.view(np.uint8).reshape(blocks, 2)], axis=1)
    return np.where(zero[:, None], 0, out).astype(np.uint8).reshape(rows, -1)
