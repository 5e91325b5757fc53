"""The KV pool: every layer's keys and values, in fixed-size blocks shared by all requests.

One tensor [layers, 2, blocks, block_size, kv_heads, head_dim] holds them (PagedAttention's
layout, and transformers' continuous batching's: a token's keys are one slot). A request owns a
block table (kv_manager.py); a forward writes each new token's keys and values into its slot,
and attention reads them back through the tables (paged_attention.py). Nothing is padded, and
nothing is copied when a request joins or leaves.

Block 0 is never handed out: it stays zero, the slot that padded reads point at.
"""
from dataclasses import dataclass

import torch
from transformers import PretrainedConfig
from transformers.generation.continuous_batching.utils import find_head_dim, find_num_key_value_heads

BLOCK_SIZE = 16  # tokens per block (vLLM's default on GPUs), and the prefix cache's unit
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
        # empty: on CPU the OS commits pages as blocks are first written, not all at start
        self.kv = torch.empty((shape.layers, 2, self.blocks, shape.block_size, shape.kv_heads, shape.head_dim),
                              dtype=shape.dtype, device=device)
        self.kv[:, :, NULL_BLOCK] = 0
        self.device = device

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of one layer: [blocks, block_size, kv_heads, head_dim] each."""
        return self.kv[index, 0], self.kv[index, 1]

    def write(self, index: int, keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor) -> None:
        """keys/values [tokens, kv_heads, head_dim] into their slots (block * block_size + offset)."""
        k, v = self.layer(index)
        k.view(-1, *k.shape[2:]).index_copy_(0, slots, keys.to(k.dtype))
        v.view(-1, *v.shape[2:]).index_copy_(0, slots, values.to(v.dtype))

    def copy_block(self, source: int, target: int) -> None:
        """Every layer's keys and values of one block into another (a forked answer's last block)."""
        self.kv[:, :, target] = self.kv[:, :, source]
