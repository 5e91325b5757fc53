"""Attention over the paged KV pool, as transformers' models call it (registered as "paged", and
"paged_float16" and the like for a pool of that dtype: `attention_name`).

The engine runs a step as one forward pass over a packed row of tokens: each sequence's new
tokens one after another (a decoding row's one, a prompt chunk's many), with their own
positions. Every attention module then calls `paged_attention` with the step's queries, keys
and values, and the `paged` argument (a PagedStep) that the engine passed to the model. It
writes the new keys and values into their slots, then each sequence's queries attend causally
over that sequence's keys, read through its block table:

- on CPU in fp32, the C kernel (paged_attention.c): one call per layer, and each query computed
  the same way whatever else the step holds, so batched equals alone bit for bit. The pool holds
  fp32 or fp16 (EngineConfig.kv_cache_dtype); every path widens fp16 keys and values to the
  queries' dtype as it reads them;
- elsewhere on CPU, one SDPA call per sequence over its keys gathered from the pool: a row's
  rounding then depends on its own length only, as before, at about 20 us of overhead a call;
- on CUDA, one SDPA call for the whole step, over keys gathered into a padded batch and masked
  (a call per sequence costs a kernel launch per row and layer there);
- in a decode step that a CUDA graph replays (a DecodeStep, cuda_graphs.py), the same padded
  SDPA call over tables of a fixed width, as many queries for each sequence (its token and its
  drafts, padded), its mask computed on the device: no shape or address changes between steps.

transformers' own continuous batching (`paged|sdpa`) gathers every key of the batch into one
sequence and masks a [tokens x all keys] product: too slow on CPU, and its rounding depends on
the neighbours.
"""
import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Optional

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward

from contract import MAX_SPECULATIVE_TOKENS

from ..core.kv_pool import BLOCK_SIZE, NULL_BLOCK, KVPool
from ..kernels import llama_layer
from ..kernels.native import paged_attention as c_paged_attention

NAME = "paged"


@dataclass
class PagedStep:
    """What every layer's attention needs to know of one step, built once per step: one KV cache
    group's view of it (its slots and tables in that group's pool, kv_pool.py), which knows every
    group's (`groups`), so that each layer picks its own (`of_layer`)."""

    pool: KVPool
    slots: torch.Tensor  # [tokens] int64, on the pool's device: where each new token's keys go
    q_lens: list[int]  # per sequence: its new tokens (queries), packed in this order
    ctx_lens: list[int]  # per sequence: its keys once this step's are written
    tables: list[list[int]]  # per sequence: its block table
    counted: list[int] = field(default_factory=list)  # layers that ran (the loader's check)
    # every group's view, in the pool's group order (empty: a pool of one group, this one)
    groups: list["PagedStep"] = field(default_factory=list, repr=False, compare=False)

    @classmethod
    def grouped(cls, pool: KVPool, q_lens: list[int], ctx_lens: list[int],
                groups: Sequence[tuple[torch.Tensor, list[list[int]]]]) -> "PagedStep":
        """The step over each KV cache group's (slots, tables), in the pool's group order: the
        first group's view, which holds them all."""
        assert len(groups) == len(pool.groups), "a step has every group's slots and tables"
        counted: list[int] = []
        steps = [cls(pool, slots, q_lens, ctx_lens, tables, counted) for slots, tables in groups]
        for step in steps:
            step.groups = steps
        return steps[0]

    def of_layer(self, layer: int) -> "PagedStep":
        """The view of the group that keeps this layer's keys."""
        if not self.groups:
            assert len(self.pool.groups) == 1, "a pool of several groups needs every group's step (grouped)"
            return self
        return self.groups[self.pool.group_of(layer)]

    @cached_property
    def q_starts(self) -> list[int]:
        starts, at = [], 0
        for n in self.q_lens:
            starts.append(at)
            at += n
        return starts

    @cached_property
    def c_args(self) -> tuple[torch.Tensor, ...]:
        """q_starts, q_lens, ctx_lens (int64) and the tables [sequences, width] (int32), for the C kernel."""
        width = max(len(t) for t in self.tables)
        tables = torch.tensor([t + [NULL_BLOCK] * (width - len(t)) for t in self.tables], dtype=torch.int32)
        return (torch.tensor(self.q_starts), torch.tensor(self.q_lens), torch.tensor(self.ctx_lens), tables)

    @cached_property
    def native_step(self) -> llama_layer.Struct:
        """This step for llama_layer.c: each group's slots and tables with its window (it points at
        `slots` and `c_args` of every group's view, which live as long as this)."""
        groups = [(step.slots, step.c_args[3], group.window)
                  for step, group in zip(self.groups or [self], self.pool.groups, strict=True)]
        return llama_layer.llama_step(self.c_args[:3], self.pool.shape.block_size, groups)

    @cached_property
    def where(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Each new token's (block, offset) in the pool."""
        size = self.pool.shape.block_size
        return torch.div(self.slots, size, rounding_mode="floor"), self.slots % size

    @cached_property
    def block_tables(self) -> list[torch.Tensor]:
        """Per sequence, its block table on the pool's device (the PyTorch paths gather through it)."""
        return [torch.tensor(table, device=self.pool.device) for table in self.tables]

    @cached_property
    def padded(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(block tables [seqs, most blocks], padded with the null block; query index [seqs, max q];
        whether each padded query is real [seqs, max q]; mask [seqs, 1, max q, max ctx])."""
        seqs, most_q, most_k = len(self.q_lens), max(self.q_lens), max(self.ctx_lens)
        width = max(len(t) for t in self.tables)
        tables = torch.tensor([t + [NULL_BLOCK] * (width - len(t)) for t in self.tables])
        queries = torch.zeros((seqs, most_q), dtype=torch.long)
        real = torch.zeros((seqs, most_q), dtype=torch.bool)
        positions = torch.zeros((seqs, most_q), dtype=torch.long)
        for s, (start, n, ctx) in enumerate(zip(self.q_starts, self.q_lens, self.ctx_lens, strict=True)):
            queries[s, :n] = torch.arange(start, start + n)
            real[s, :n] = True
            positions[s, :n] = torch.arange(ctx - n, ctx)
        mask = torch.arange(most_k)[None, None, :] <= positions[:, :, None]
        mask[:, :, 0] |= ~real  # padded queries see one key: no NaN
        device = self.pool.device
        return tables.to(device), queries.to(device), real.to(device), mask[:, None].to(device)


@dataclass
class DecodeStep:
    """A decode step whose tensors keep their shapes and addresses from step to step
    (cuda_graphs.py fills them, then replays the kernels captured over them): the same number of
    queries for every sequence (its next token, then its drafts, then padding), its keys read
    through a block table padded with the null block to a fixed width."""

    pool: KVPool
    slots: torch.Tensor  # [sequences * queries] int64: where each new token's keys go
    tables: torch.Tensor  # [sequences, width] int64
    seen: torch.Tensor  # [sequences, queries] int64: the keys each query sees (its position + 1)
    counted: list[int] = field(default_factory=list)
    where: tuple[torch.Tensor, torch.Tensor] = field(init=False)
    mask: torch.Tensor = field(init=False)  # [sequences, 1, queries, width * block_size]

    def prepare(self) -> None:
        """The step's derived tensors, computed by device operations (inside the captured region)."""
        size = self.pool.shape.block_size
        self.where = torch.div(self.slots, size, rounding_mode="floor"), self.slots % size
        keys = torch.arange(self.tables.shape[1] * size, device=self.slots.device)
        self.mask = (keys[None, None, :] < self.seen[:, :, None])[:, None]


def attention_name(kv_dtype: torch.dtype) -> str:
    """The attention implementation a model sets (`set_attn_implementation`) to go through the
    paged pool, whose keys and values are `kv_dtype`: "paged", or "paged_float16" and the like
    where a direct forward rounds them to that dtype as the pool does."""
    return NAME if kv_dtype == torch.float32 else f"{NAME}_{str(kv_dtype).removeprefix('torch.')}"


def paged_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: Optional[torch.Tensor], dropout: float = 0.0, scaling: Optional[float] = None,
                    paged: Optional[PagedStep | DecodeStep] = None, sliding_window: Optional[int] = None,
                    kv_dtype: Optional[torch.dtype] = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """query [1, heads, tokens, dim], key/value [1, kv_heads, tokens, dim] (this step's new
    tokens, packed); returns [1, tokens, heads, dim], as transformers' SDPA does. Outside the
    engine's steps (no `paged`: transformers' own generate, a direct forward), see
    `_outside_the_engine`; kv_dtype: the pool's (`attention_name`), None: the keys' own."""
    if paged is None:
        return _outside_the_engine(module, query, key, value, attention_mask, dropout, scaling, sliding_window,
                                   kv_dtype or key.dtype, **kwargs)
    if getattr(module, "sinks", None) is not None:
        raise ValueError("paged attention: attention sinks are not supported")
    cap = _softcap(kwargs)
    layer = int(module.layer_idx)  # type: ignore[arg-type]  # every attention layer has one
    window = sliding_window or 0
    if paged.pool.groups[paged.pool.group_of(layer)].window and not window:
        raise ValueError(f"paged attention: layer {layer} keeps its keys in a sliding window's group but passed "
                         f"no window")
    if isinstance(paged, PagedStep):
        paged = paged.of_layer(layer)
    paged.pool.write(layer, key[0].transpose(0, 1), value[0].transpose(0, 1), *paged.where)
    k_pool, v_pool = paged.pool.layer(layer)
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    out: Optional[torch.Tensor]
    if isinstance(paged, DecodeStep):
        if window:
            raise ValueError("paged attention: a captured decode step knows no sliding window")
        out = _fixed_width(query, k_pool, v_pool, paged, scale, cap)
    else:
        out = c_paged_attention(query, k_pool, v_pool, paged.c_args, scale, window, cap)
        if out is None:
            padded = query.device.type == "cuda"
            out = (_padded if padded else _per_sequence)(query, layer, paged, scale, window, cap)
    paged.counted.append(layer)
    return out[None], None


def _outside_the_engine(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        mask: Optional[torch.Tensor], dropout: float, scaling: Optional[float],
                        sliding_window: Optional[int], kv_dtype: torch.dtype, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """One sequence, causal (a direct forward, transformers' generate): the same C kernel as the
    engine, its keys laid out in the pool's blocks and `kv_dtype`, so such a forward computes
    exactly what the engine does (tests compare the two). Anything else: transformers' SDPA,
    over keys and values rounded to the pool's dtype."""
    if kv_dtype != key.dtype:
        key, value = key.to(kv_dtype), value.to(kv_dtype)
    rows, heads, q_len, dim = query.shape
    width = key.shape[2]
    causal = q_len == 1 or q_len == width if mask is None else _end_aligned_causal(mask, q_len, width)
    if rows == 1 and causal and query.device.type == "cpu":  # laid out in blocks as the pool keeps them
        size, heads_kv = BLOCK_SIZE, key.shape[1]
        blocks = -(-width // size)
        padded = (0, 0, 0, blocks * size - width)
        k_pool = F.pad(key[0], padded).view(heads_kv, blocks, size, dim).permute(1, 0, 3, 2).contiguous()
        v_pool = F.pad(value[0], padded).view(heads_kv, blocks, size, dim).permute(1, 2, 0, 3).contiguous()
        args = (torch.tensor([0]), torch.tensor([q_len]), torch.tensor([width]),
                torch.arange(blocks, dtype=torch.int32)[None])
        out = c_paged_attention(query, k_pool, v_pool, args, dim ** -0.5 if scaling is None else scaling,
                                sliding_window or 0, _softcap(kwargs))
        if out is not None:
            return out[None], None
    key, value = key.to(query.dtype), value.to(query.dtype)
    if _softcap(kwargs):  # transformers' SDPA knows no cap: its eager attention does
        out, _ = eager_attention_forward(module, query, key, value, _additive(mask, q_len, width, query),
                                         dropout=dropout, scaling=scaling, sliding_window=sliding_window, **kwargs)
        return out, None
    return sdpa_attention_forward(module, query, key, value, mask, dropout=dropout, scaling=scaling,
                                  sliding_window=sliding_window, **kwargs)


def _end_aligned_causal(mask: torch.Tensor, q_len: int, width: int) -> bool:
    """Whether a boolean mask [1, 1, q, k] lets query i see keys up to width - q_len + i, no more."""
    if mask.dtype != torch.bool or mask.shape[-2:] != (q_len, width) or mask.shape[0] != 1:
        return False
    return torch.equal(mask[0, 0], _causal(q_len, width, mask.device))


def _causal(q_len: int, width: int, device: torch.device) -> torch.Tensor:
    """[q_len, width] booleans: query i sees keys up to width - q_len + i (the last queries of a
    causal sequence)."""
    return torch.ones(q_len, width, dtype=torch.bool, device=device).tril(width - q_len)


def _softcap(kwargs: dict[str, Any]) -> float:
    """The cap on the attention scores that the model passes (Gemma 2's `softcap`; 0: none)."""
    return float(kwargs.get("softcap") or 0.0)


def _window_mask(q_len: int, ctx: int, window: int, device: torch.device) -> Optional[torch.Tensor]:
    """Query i (at position ctx - q_len + i) over keys [lo, that position]; None when that is
    every key (one query, no window)."""
    if q_len == 1 and (not window or ctx <= window):
        return None
    keys = torch.arange(ctx, device=device)
    at = torch.arange(ctx - q_len, ctx, device=device)[:, None]
    mask = keys <= at
    if window:
        mask &= keys > at - window
    return mask


def _additive(mask: Optional[torch.Tensor], q_len: int, width: int, query: torch.Tensor) -> torch.Tensor:
    """The mask as eager attention adds it: 0 where a query sees a key, the dtype's least
    elsewhere (causal, end-aligned, where no mask is given)."""
    if mask is None:
        mask = _causal(q_len, width, query.device)[None, None]
    if mask.dtype != torch.bool:
        return mask
    return torch.zeros(mask.shape, dtype=query.dtype, device=query.device).masked_fill(
        ~mask, torch.finfo(query.dtype).min)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor], scale: float,
          cap: float) -> torch.Tensor:
    """PyTorch's SDPA (grouped keys where q has more heads); with a cap on the scores (Gemma
    2's), which SDPA cannot take, the same product written out: cap * tanh(scores / cap), masked
    (a boolean mask: True sees), softmaxed in fp32, over the values."""
    gqa = q.shape[-3] != k.shape[-3]
    if not cap:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=gqa)
    if gqa:
        groups = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(groups, dim=-3), v.repeat_interleave(groups, dim=-3)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    scores = torch.tanh(scores / cap) * cap
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype), v)


def _per_sequence(query: torch.Tensor, layer: int, step: PagedStep, scale: float, window: int,
                  cap: float) -> torch.Tensor:
    """One SDPA call per sequence over its own keys: [tokens, heads, dim]. A few queries (a row's
    last token and its drafts) go one call each, over exactly the keys a decode step of each would
    see, so speculation changes no number here either."""
    heads, dim = query.shape[1], query.shape[-1]
    out = query.new_empty((query.shape[2], heads, dim))
    for s, (start, n, ctx) in enumerate(zip(step.q_starts, step.q_lens, step.ctx_lens, strict=True)):
        keys, values = (t[None].to(query.dtype) for t in step.pool.gather(layer, step.block_tables[s], ctx))
        one_by_one = n <= 1 + MAX_SPECULATIVE_TOKENS
        for q0, q1 in ([(i, i + 1) for i in range(n)] if one_by_one else [(0, n)]):
            seen = ctx - n + q1  # keys up to the last of these queries
            lo = max(0, seen - window) if window and one_by_one else 0
            mask = _window_mask(q1 - q0, seen, window, query.device) if not one_by_one else None
            o = _sdpa(query[:, :, start + q0:start + q1], keys[:, :, lo:seen], values[:, :, lo:seen], mask, scale,
                      cap)
            out[start + q0:start + q1] = o[0].transpose(0, 1)
    return out


def _padded(query: torch.Tensor, layer: int, step: PagedStep, scale: float, window: int,
            cap: float) -> torch.Tensor:
    """One SDPA call over every sequence, padded to the longest: [tokens, heads, dim]."""
    if window:  # the padded mask knows no window
        return _per_sequence(query, layer, step, scale, window, cap)
    tables, queries, real, mask = step.padded
    heads, dim = query.shape[1], query.shape[-1]
    keys, values = _gather(*step.pool.layer(layer), tables, mask.shape[-1], query.dtype)
    q = query[0].transpose(0, 1)[queries].transpose(1, 2)  # [seqs, heads, max q, dim]
    o = _sdpa(q, keys, values, mask, scale, cap)
    out = query.new_empty((query.shape[2], heads, dim))
    out[queries[real]] = o.transpose(1, 2)[real]
    return out


def _fixed_width(query: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, step: DecodeStep,
                 scale: float, cap: float) -> torch.Tensor:
    """_padded's SDPA call for the same number of queries a sequence, over tables of the step's
    fixed width: [tokens, heads, dim]."""
    heads, dim = query.shape[1], query.shape[-1]
    seqs, queries = step.seen.shape
    keys, values = _gather(k_pool, v_pool, step.tables, step.mask.shape[-1], query.dtype)
    q = query[0].transpose(0, 1).reshape(seqs, queries, heads, dim).transpose(1, 2)  # [seqs, heads, queries, dim]
    o = _sdpa(q, keys, values, step.mask, scale, cap)
    return o.transpose(1, 2).reshape(seqs * queries, heads, dim)


def _gather(k_pool: torch.Tensor, v_pool: torch.Tensor, tables: torch.Tensor, keys: int,
            dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sequence's first `keys` keys and values, read through its table padded with the null
    block: [seqs, kv_heads, keys, dim] each, in `dtype`."""
    k = k_pool[tables].permute(0, 2, 1, 4, 3).flatten(2, 3)[:, :, :keys].to(dtype)
    v = v_pool[tables].flatten(1, 2)[:, :keys].transpose(1, 2).to(dtype)
    return k, v


for _dtype in (torch.float32, torch.float16, torch.bfloat16):
    AttentionInterface.register(attention_name(_dtype), functools.partial(paged_attention, kv_dtype=_dtype))
    AttentionMaskInterface.register(attention_name(_dtype), sdpa_mask)  # for the plain SDPA outside the steps
