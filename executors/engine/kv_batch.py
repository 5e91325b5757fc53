"""The running batch's KV cache: rows left-padded to one length (TGI's CausalLMBatch).

A row joins after its own prefill and leaves the moment it finishes; columns
that are padding for every row are trimmed, so memory follows the live rows.
Each layer keeps spare capacity, so a decode step writes one column in place
instead of copying the whole cache as `DynamicCache.update` does.
"""
from typing import Any, cast

import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer


class SlabLayer(DynamicLayer):
    """A DynamicLayer that appends into preallocated room."""

    keys: torch.Tensor
    values: torch.Tensor
    _slab_k: torch.Tensor
    _slab_v: torch.Tensor
    _len: int = 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
            self._len = 0
        need = self._len + key_states.shape[-2]
        if self._len == 0 or need > self._slab_k.shape[-2]:
            self._regrow(key_states, need)
        self._slab_k[..., self._len:need, :] = key_states
        self._slab_v[..., self._len:need, :] = value_states
        self._len = need
        self.keys = self._slab_k[..., :need, :]
        self.values = self._slab_v[..., :need, :]
        return self.keys, self.values

    def _regrow(self, like: torch.Tensor, need: int) -> None:
        shape = (*like.shape[:-2], _capacity(need), like.shape[-1])
        new_k, new_v = like.new_empty(shape), like.new_empty(shape)
        if self._len:
            new_k[..., :self._len, :] = self.keys
            new_v[..., :self._len, :] = self.values
        self._slab_k, self._slab_v = new_k, new_v

    @classmethod
    def from_blocks(cls, keys: list[torch.Tensor], values: list[torch.Tensor]) -> "SlabLayer":
        """One row of the blocks [kv_heads, block, dim] laid end to end, copied once into a slab
        with room for what follows (a prompt after its cached prefix)."""
        layer = cls()
        length = sum(k.shape[-2] for k in keys)
        shape = (1, keys[0].shape[0], _capacity(length), keys[0].shape[-1])
        layer._slab_k, layer._slab_v = keys[0].new_empty(shape), values[0].new_empty(shape)
        at = 0
        for k, v in zip(keys, values, strict=True):
            layer._slab_k[0, :, at:at + k.shape[-2]] = k
            layer._slab_v[0, :, at:at + k.shape[-2]] = v
            at += k.shape[-2]
        layer._len, layer.keys, layer.values = length, layer._slab_k[..., :length, :], layer._slab_v[..., :length, :]
        layer.dtype, layer.device, layer.is_initialized = keys[0].dtype, keys[0].device, True
        return layer

    def stack(self, keys: list[torch.Tensor], values: list[torch.Tensor], width: int) -> None:
        """Install row blocks, right-aligned to `width` columns (left pad zero, never garbage:
        masked columns still enter attention as 0 x value), copied once into a fresh slab."""
        rows = sum(k.shape[0] for k in keys)
        shape = (rows, *keys[0].shape[1:-2], _capacity(width), keys[0].shape[-1])
        slab_k, slab_v = keys[0].new_zeros(shape), values[0].new_zeros(shape)
        row = 0
        for k, v in zip(keys, values, strict=True):
            n, length = k.shape[0], k.shape[-2]
            slab_k[row:row + n, ..., width - length:width, :] = k
            slab_v[row:row + n, ..., width - length:width, :] = v
            row += n
        self._slab_k, self._slab_v, self._len = slab_k, slab_v, width
        self.keys, self.values = slab_k[..., :width, :], slab_v[..., :width, :]
        self.dtype, self.device, self.is_initialized = slab_k.dtype, slab_k.device, True


def _capacity(need: int) -> int:
    """Room for the next decode steps without a regrow, but never much more than needed."""
    return need + max(16, min(need // 2, 256))


def new_cache() -> DynamicCache:
    cache = DynamicCache()
    cache.layer_class_to_replicate = SlabLayer
    return cache


def slabs(cache: DynamicCache) -> list[SlabLayer]:
    """The cache's layers: SlabLayers, as `new_cache` makes them."""
    return cast(list[SlabLayer], cache.layers)


class KVBatch:
    """Tensors of the running rows; row order matches `self.rows`."""

    def __init__(self, model: PreTrainedModel, device: torch.device):
        self.model = model
        self.device = device
        self._clear()

    def _clear(self) -> None:
        device = self.device
        self.rows: list[str] = []
        self.cache: DynamicCache | None = None
        self.mask = torch.zeros((0, 0), dtype=torch.long, device=device)
        self.positions = torch.zeros(0, dtype=torch.long, device=device)
        self.last_tokens = torch.zeros(0, dtype=torch.long, device=device)

    def __len__(self) -> int:
        return len(self.rows)

    def consistent(self) -> bool:
        """Every layer holds exactly the rows listed (false after a merge failed half-way)."""
        return self.cache is None or all(layer.keys.shape[0] == len(self.rows) for layer in slabs(self.cache))

    def add(self, row_ids: list[str], cache: DynamicCache, mask: torch.Tensor,
            next_tokens: list[int]) -> None:
        """Join prefilled rows: their own cache, left-padded like `mask` [rows, width]."""
        mask = mask.to(self.device)
        tokens = torch.tensor(next_tokens, dtype=torch.long, device=self.device)
        positions = mask.sum(1)
        if self.cache is None:
            self.cache, self.mask = cache, mask
            self.positions, self.last_tokens, self.rows = positions, tokens, list(row_ids)
            return
        width = max(self.mask.shape[1], mask.shape[1])
        for mine, theirs in zip(slabs(self.cache), slabs(cache), strict=True):  # one layer at a time
            mine.stack([mine.keys, theirs.keys], [mine.values, theirs.values], width)
        self.mask = torch.cat([_pad_left(self.mask, width), _pad_left(mask, width)])
        self.positions = torch.cat([self.positions, positions])
        self.last_tokens = torch.cat([self.last_tokens, tokens])
        self.rows.extend(row_ids)

    def keep(self, keep_ids: list[str]) -> None:
        """Drop every row not in keep_ids, then trim all-padding columns."""
        if keep_ids == self.rows:
            return
        if not keep_ids or self.cache is None:
            self._clear()
            return
        index = torch.tensor([self.rows.index(r) for r in keep_ids], device=self.device)
        self.mask = self.mask[index]
        start = int((self.mask.cumsum(1) == 0).sum(1).min())  # leading pad columns shared by all
        self.mask = self.mask[:, start:]
        width = self.mask.shape[1]
        for layer in slabs(self.cache):
            layer.stack([layer.keys[index][..., start:, :]], [layer.values[index][..., start:, :]], width)
        self.positions = self.positions[index]
        self.last_tokens = self.last_tokens[index]
        self.rows = list(keep_ids)

    @torch.inference_mode()
    def decode_step(self) -> torch.Tensor:
        """Feed every row its last token; return next-token logits [rows, vocab] in float32."""
        ones = torch.ones((len(self.rows), 1), dtype=torch.long, device=self.device)
        mask = torch.cat([self.mask, ones], dim=1)
        out = self.model(input_ids=self.last_tokens[:, None], attention_mask=mask,
                         position_ids=self.positions[:, None], past_key_values=self.cache,
                         use_cache=True)
        self.mask = mask
        self.positions = self.positions + 1
        return out.logits[:, -1, :].float()

    def set_next_tokens(self, tokens: list[int]) -> None:
        self.last_tokens = torch.tensor(tokens, dtype=torch.long, device=self.device)


def _pad_left(mask: torch.Tensor, width: int) -> torch.Tensor:
    """Zero-pad an attention mask [rows, cols] on the left to `width` columns."""
    missing = width - mask.shape[1]
    return mask if missing == 0 else torch.cat([mask.new_zeros((mask.shape[0], missing)), mask], 1)


def select_rows(cache: DynamicCache, index: list[int]) -> None:
    """Keep only these batch rows of a cache (prefilled rows that finished at once leave)."""
    idx = torch.tensor(index, dtype=torch.long, device=slabs(cache)[0].keys.device)
    for layer in slabs(cache):
        layer.stack([layer.keys[idx]], [layer.values[idx]], layer.keys.shape[-2])


@torch.inference_mode()
def prefill_group(model: PreTrainedModel, cache: DynamicCache, prompts: list[list[int]],
                  device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Whole prompts in one left-padded forward; return (last logits [rows, vocab], mask)."""
    width = max(len(p) for p in prompts)
    ids = torch.zeros((len(prompts), width), dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.tensor(prompt)
        mask[row, width - len(prompt):] = 1
    ids, mask = ids.to(device), mask.to(device)
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions,
                past_key_values=cache, use_cache=True, logits_to_keep=1)
    return out.logits[:, -1, :].float(), mask


@torch.inference_mode()
def prefill_chunk(model: PreTrainedModel, cache: DynamicCache, ids: list[int], start: int,
                  device: torch.device) -> torch.Tensor:
    """Run one chunk of a long prompt (positions start..) into its own cache; return last logits."""
    input_ids = torch.tensor([ids], dtype=torch.long, device=device)
    positions = torch.arange(start, start + len(ids), device=device)[None]
    mask = torch.ones((1, start + len(ids)), dtype=torch.long, device=device)
    out = model(input_ids=input_ids, attention_mask=mask, position_ids=positions,
                past_key_values=cache, use_cache=True, logits_to_keep=1)
    return out.logits[:, -1, :].float()
