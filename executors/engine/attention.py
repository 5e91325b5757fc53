"""Row-wise attention: each batch row attends over its own keys only, never its left padding.

A padded SDPA sums a row's keys in blocks that start at the padding, so the row's rounding
depends on how long its neighbours are. In fp32 that stays below a token's worth, but int4's
matmuls take bf16 inputs, and one fp32 rounding can tip a bf16 one: 4 of 6 batched runs then
changed a request. With this attention, and int4's row-invariant matmuls, a row comes out bit
for bit as it does alone. native.py's C kernel (row_attention.c) does this for all rows in one
call per layer, for decode steps, prefills, and chunks after their cached keys (a long
prompt's, or one after a cached prefix), which it computes as the whole prompt's prefill would,
query by query. Where it is not built, one SDPA call per row does it, at about 20 us of overhead
per call.
"""
from typing import Any, Optional

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from .native import row_attention

NAME = "row_sdpa"


def row_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
             attention_mask: Optional[torch.Tensor], dropout: float = 0.0, scaling: Optional[float] = None,
             **kwargs: Any) -> tuple[torch.Tensor, None]:
    """query [rows, heads, q, dim], key/value [rows, kv_heads, k, dim], attention_mask boolean
    [rows, 1, q, k] (True: attend) or None; returns [rows, q, heads, dim], as transformers' SDPA."""
    plan = _plan(attention_mask, query.shape[0], query.shape[2])
    if all(causal or (mask is None and query.shape[2] == 1)
           for _, _, mask, causal in plan):  # what the kernel computes: see row_attention.c
        scale = query.shape[-1] ** -0.5 if scaling is None else scaling
        out = row_attention(query, key, value, [p[1] for p in plan], [p[0] for p in plan], scale)
        if out is not None:
            return out, None
    out = torch.zeros_like(query)
    gqa = query.shape[1] != key.shape[1]
    for row, (q_start, start, mask, causal) in enumerate(plan):
        out[row:row + 1, :, q_start:] = F.scaled_dot_product_attention(
            query[row:row + 1, :, q_start:], key[row:row + 1, :, start:], value[row:row + 1, :, start:],
            attn_mask=mask, is_causal=causal and mask is None, scale=scaling, enable_gqa=gqa)
    return out.transpose(1, 2).contiguous(), None


Plan = list[tuple[int, int, Optional[torch.Tensor], bool]]
_last: tuple[Optional[torch.Tensor], int, int, Plan] = (None, 0, 0, [])


def _plan(mask: Optional[torch.Tensor], rows: int, q_len: int) -> Plan:
    """Per row: (first real query, first real key, mask or None, causal). Every layer of a
    forward gets the same mask object: the plan is made once per forward."""
    global _last
    last = _last  # one read: engines on other threads may replace it
    if mask is not None and last[0] is mask and last[1:3] == (rows, q_len):
        return last[3]
    k_len = q_len if mask is None else mask.shape[-1]
    starts = [0] * rows if mask is None else mask[:, 0, -1, :].int().argmax(dim=1).tolist()
    plan = []
    for row, start in enumerate(starts):
        q_start = max(0, q_len - (k_len - start))  # a left-padded prefill's padding queries
        sliced = None if mask is None else mask[row:row + 1, :, q_start:, start:]
        plan.append((q_start, start, *_plain(sliced, q_len - q_start, k_len - start)))
    _last = (mask, rows, q_len, plan)
    return plan


def _plain(mask: Optional[torch.Tensor], q: int, k: int) -> tuple[Optional[torch.Tensor], bool]:
    """(mask, causal): the same SDPA call for a row whatever its batch: no mask where it only
    says 'every key' or 'causal', as transformers passes for a request alone. A chunk after its
    cached keys (each query over the keys up to its own position) is causal too, for the
    kernel, and keeps its mask for SDPA (whose is_causal aligns queries to the first key)."""
    if mask is None or bool(mask.all()):
        return None, mask is None and q > 1
    causal = torch.equal(mask[0, 0], torch.ones(q, k, dtype=torch.bool, device=mask.device).tril(k - q))
    return (None if q == k and causal else mask), causal


AttentionInterface.register(NAME, row_sdpa)
AttentionMaskInterface.register(NAME, sdpa_mask)
