"""The KV pool: every layer's keys and values, in fixed-size blocks shared by all requests.

A request owns a block table (kv_manager.py); a forward writes each new token's keys and values
into its slot (block, offset), and attention reads them back through the tables
(paged_attention.py). Nothing is padded, and nothing is copied when a request joins or leaves.
Keys are stored transposed within a block, [kv_heads, head_dim, block_size], so that the C
kernel scores a block's keys as the lanes of one vector; values as rows, [block_size, kv_heads,
head_dim] (PagedAttention keeps its keys in a layout of their own for the same reason).

Block 0 is never handed out: padded reads point at it, masked. It starts zero; only a decode
step that a CUDA graph replays writes there, its padding rows' keys (cuda_graphs.py).

The layers are split in KV cache groups (vLLM's), one per attention kind, each with its own
tensors: the full-attention layers keep their keys in the table's own blocks (group 0, present
even where it has no layer, as its blocks are what a row's table lists); a model's sliding-window
layers keep theirs in a second, smaller pool (group 1): such a layer reads only a sequence's last
`window` keys, so a row holds only the blocks of its window there (window_blocks.py lends them).
Its size is what the rows that may run at once need. Each group has a manager (kv_groups.py).
"""
from dataclasses import dataclass

import torch
from transformers import PretrainedConfig
from transformers.generation.continuous_batching.utils import find_head_dim, find_num_key_value_heads

from contract.blocks import BLOCK_SIZE

__all__ = ["BLOCK_SIZE", "NULL_BLOCK", "KVGroup", "KVPool", "KVShape"]
NULL_BLOCK = 0


@dataclass(frozen=True)
class KVShape:
    layers: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype
    block_size: int = BLOCK_SIZE
    windows: tuple[int, ...] = ()  # each layer's sliding window in keys (0: none); () for none at all

    @classmethod
    def of(cls, config: PretrainedConfig, dtype: torch.dtype, windows: tuple[int, ...] = (),
           block_size: int = BLOCK_SIZE) -> "KVShape":
        text = config.get_text_config()
        return cls(text.num_hidden_layers, find_num_key_value_heads(text), find_head_dim(text), dtype, block_size,
                   windows if any(windows) else ())

    @property
    def window(self) -> int:
        """The window layers' window (the widest where they differ); 0 where no layer has one."""
        return max(self.windows, default=0)

    @property
    def main_layers(self) -> list[int]:
        return [i for i in range(self.layers) if not self.windows or not self.windows[i]]

    @property
    def window_layers(self) -> list[int]:
        return [i for i in range(self.layers) if self.windows and self.windows[i]]

    @property
    def bytes_per_token(self) -> int:
        return self.layers * 2 * self.kv_heads * self.head_dim * self.dtype.itemsize

    def blocks_for(self, budget_tokens: int, budget_bytes: int = 0, rows: int = 1,
                   step_tokens: int = 0) -> tuple[int, int]:
        """Usable blocks of the main pool and of the window pool (0: no layer has a window).

        The window pool holds what `rows` rows' windows and a step's `step_tokens` new tokens
        need, never more than the main pool. By tokens, the main pool holds `budget_tokens`. By
        bytes, the main pool gets what the window pool leaves of `budget_bytes` (where every
        layer has a window, the main pool stores nothing and `budget_tokens` sizes it)."""
        size, window = self.block_size, self.window
        need = rows * (-(-window // size) + 2) + -(-step_tokens // size) + 1 if window else 0
        if not budget_bytes:
            main = max(1, budget_tokens // size)
            return main, min(main, need)
        layer_block = self.bytes_per_token // self.layers * size  # one layer's keys and values of a block
        main_layers, window_layers = len(self.main_layers), len(self.window_layers)
        if not main_layers:
            main = max(1, budget_tokens // size)
            return main, max(1, min(main, need, budget_bytes // (layer_block * window_layers)))
        main = (budget_bytes - need * window_layers * layer_block) // (main_layers * layer_block)
        if main < need:  # too small a budget for the window pool's own size: both alike
            main = max(1, budget_bytes // (self.layers * layer_block))
            return main, min(main, need)
        return main, need


@dataclass(frozen=True)
class KVGroup:
    """One KV cache group: the layers of one attention kind, whose keys live in tensors of their
    own, in blocks that the group's manager (kv_groups.py) hands out."""

    layers: tuple[int, ...]  # the model's layers, in order
    window: int  # the keys a query reads back: 0 for all of them (full attention)
    blocks: int  # usable blocks, the null block not counted


class KVPool:
    """The tensors, one pair per KV cache group; kv_manager.py decides which blocks belong to whom."""

    def __init__(self, shape: KVShape, blocks: int, device: torch.device, window_blocks: int = 0):
        """blocks: the table's usable blocks (the full-attention group's); window_blocks: the
        window group's (where the shape has window layers)."""
        self.shape = shape
        self.blocks = blocks + 1  # and the null block
        self.groups = [KVGroup(tuple(shape.main_layers), 0, blocks)]
        if shape.windows:
            assert window_blocks > 0, "window layers need window blocks"
            self.groups.append(KVGroup(tuple(shape.window_layers), shape.window, window_blocks))
        made = [self._make(len(group.layers), group.blocks + 1, device) for group in self.groups]
        self.group_keys, self.group_values = [k for k, _ in made], [v for _, v in made]
        self._at = {layer: (g, i) for g, group in enumerate(self.groups) for i, layer in enumerate(group.layers)}
        self.device = device

    @property
    def keys(self) -> torch.Tensor:
        """The full-attention layers' keys [layers, blocks, kv_heads, head_dim, block_size]."""
        return self.group_keys[0]

    @property
    def values(self) -> torch.Tensor:
        """The full-attention layers' values [layers, blocks, block_size, kv_heads, head_dim]."""
        return self.group_values[0]

    def _make(self, layers: int, blocks: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        size, heads, dim, dtype = self.shape.block_size, self.shape.kv_heads, self.shape.head_dim, self.shape.dtype
        # on CPU, empty: the OS commits pages as blocks are first written; on a GPU, zeros (a padded
        # read may meet a block's unwritten slots, masked, and must not meet NaN there)
        make = torch.zeros if device.type == "cuda" else torch.empty
        keys = make((layers, blocks, heads, dim, size), dtype=dtype, device=device)
        values = make((layers, blocks, size, heads, dim), dtype=dtype, device=device)
        keys[:, NULL_BLOCK] = 0
        values[:, NULL_BLOCK] = 0
        return keys, values

    def group_of(self, index: int) -> int:
        """The KV cache group that keeps a layer's keys."""
        return self._at[index][0]

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys [blocks, kv_heads, head_dim, block_size] and values [blocks, block_size, kv_heads,
        head_dim] of one layer, in its group's tensors."""
        group, at = self._at[index]
        return self.group_keys[group][at], self.group_values[group][at]

    def all_layers(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Keys and values of every layer, in order, as `layer` gives one."""
        pairs = [self.layer(i) for i in range(self.shape.layers)]
        return [k for k, _ in pairs], [v for _, v in pairs]

    def write(self, index: int, keys: torch.Tensor, values: torch.Tensor, blocks: torch.Tensor,
              offsets: torch.Tensor) -> None:
        """keys/values [tokens, kv_heads, head_dim] into their slots: (block, offset) each."""
        k, v = self.layer(index)
        k.permute(0, 3, 1, 2)[blocks, offsets] = keys.to(k.dtype)
        v[blocks, offsets] = values.to(v.dtype)

    def copy_block(self, group: int, source: int, target: int) -> None:
        """Every layer of a group: its keys and values of one block into another (a forked
        answer's last block)."""
        keys, values = self.group_keys[group], self.group_values[group]
        keys[:, target] = keys[:, source]
        values[:, target] = values[:, source]

    def gather(self, index: int, table: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One sequence's first `length` keys and values of a layer, in order: [kv_heads, length,
        head_dim] each (the PyTorch paths read them so)."""
        k, v = self.layer(index)
        keys = k[table].permute(1, 0, 3, 2).flatten(1, 2)[:, :length]
        values = v[table].flatten(0, 1)[:length].transpose(0, 1)
        return keys, values
