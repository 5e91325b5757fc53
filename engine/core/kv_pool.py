"""The KV pool: every layer's keys and values, in fixed-size blocks shared by all requests.

A request owns a block table (kv_manager.py); a forward writes each new token's keys and values
into its slot (block, offset), and attention reads them back through the tables
(paged_attention.py). Nothing is padded, and nothing is copied when a request joins or leaves.
Keys are stored transposed within a block, [kv_heads, head_dim, block_size], so that the C
kernel scores a block's keys as the lanes of one vector; values as rows, [block_size, kv_heads,
head_dim] (PagedAttention keeps its keys in a layout of their own for the same reason).

Block 0 is never handed out: padded reads point at it, masked. It starts zero; only a decode
step that a CUDA graph replays writes there, its padding rows' keys (cuda_graphs.py).
"""
from dataclasses import dataclass

import torch
from transformers import PretrainedConfig
from transformers.generation.continuous_batching.utils import find_head_dim, find_num_key_value_heads

from contract.blocks import BLOCK_SIZE

__all__ = ["BLOCK_SIZE", "NULL_BLOCK", "KVPool", "KVShape"]
NULL_BLOCK = 0


@dataclass(frozen=True)
class KVShape:
    layers: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype
    block_size: int = BLOCK_SIZE

    @classmethod
    def of(cls, config: PretrainedConfig, dtype: torch.dtype, block_size: int = BLOCK_SIZE) -> "KVShape":
        text = config.get_text_config()
        return cls(text.num_hidden_layers, find_num_key_value_heads(text), find_head_dim(text), dtype, block_size)

    @property
    def bytes_per_token(self) -> int:
        return self.layers * 2 * self.kv_heads * self.head_dim * self.dtype.itemsize

    def blocks_for(self, budget_tokens: int, budget_bytes: int = 0) -> int:
        """Usable blocks of a pool sized by tokens, or by bytes where those are given."""
        tokens = budget_bytes // self.bytes_per_token if budget_bytes else budget_tokens
        return max(1, tokens // self.block_size)


class KVPool:
    """The tensors; kv_manager.py decides which blocks belong to whom."""

    def __init__(self, shape: KVShape, blocks: int, device: torch.device):
        self.shape = shape
        self.blocks = blocks + 1  # and the null block
        size, heads, dim = shape.block_size, shape.kv_heads, shape.head_dim
        # on CPU, empty: the OS commits pages as blocks are first written; on a GPU, zeros (a padded
        # read may meet a block's unwritten slots, masked, and must not meet NaN there)
        make = torch.zeros if device.type == "cuda" else torch.empty
        self.keys = make((shape.layers, self.blocks, heads, dim, size), dtype=shape.dtype, device=device)
        self.values = make((shape.layers, self.blocks, size, heads, dim), dtype=shape.dtype, device=device)
        self.keys[:, NULL_BLOCK] = 0
        self.values[:, NULL_BLOCK] = 0
        self.device = device

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys [blocks, kv_heads, head_dim, block_size] and values [blocks, block_size, kv_heads,
        head_dim] of one layer."""
        return self.keys[index], self.values[index]

    def all_layers(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of every layer, [layers, ...] as `layer` gives one."""
        return self.keys, self.values

    def write(self, index: int, keys: torch.Tensor, values: torch.Tensor, blocks: torch.Tensor,
              offsets: torch.Tensor) -> None:
        """keys/values [tokens, kv_heads, head_dim] into their slots: (block, offset) each."""
        k, v = self.layer(index)
        k.permute(0, 3, 1, 2)[blocks, offsets] = keys.to(k.dtype)
        v[blocks, offsets] = values.to(v.dtype)

    def copy_block(self, source: int, target: int) -> None:
        """Every layer's keys and values of one block into another (a forked answer's last block)."""
        self.keys[:, target] = self.keys[:, source]
        self.values[:, target] = self.values[:, source]

    def gather(self, index: int, table: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One sequence's first `length` keys and values of a layer, in order: [kv_heads, length,
        head_dim] each (the PyTorch paths read them so)."""
        k, v = self.layer(index)
        keys = k[table].permute(1, 0, 3, 2).flatten(1, 2)[:, :length]
        values = v[table].flatten(0, 1)[:length].transpose(0, 1)
        return keys, values
