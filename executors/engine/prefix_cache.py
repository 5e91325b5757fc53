"""Automatic prefix caching: the KV of prompts already seen, reused by the requests that start
with them, so a conversation's next turn, or a shared system prompt, prefills only what is new.

As in vLLM, the cache holds full blocks of `block_size` tokens, each keyed by its tokens and its
parent block (a hash chain), so a block is only ever reused after the same whole prefix. A
request reuses its longest cached chain and prefills the rest as a chunk after those keys.
Blocks stay until the cache needs room, least recently used first.

Reuse changes no number: the C kernels compute each token's keys and values, and each query's
attention, the same way whatever else is in the forward pass (row_attention.c, int4_matmul.c),
so a prompt's suffix after cached keys comes out bit for bit as in the whole prompt's prefill,
and so do the keys a decode step wrote. (On the fallbacks, PyTorch's matmuls round by shape:
there, as for batching, the tokens are the same and the numbers within float rounding.)
"""
import collections
from collections.abc import Callable
from dataclasses import dataclass

import torch

BLOCK_SIZE = 16  # tokens per block (vLLM's default on GPUs)
BlockKV = tuple[list[torch.Tensor], list[torch.Tensor]]  # per layer: keys, values [kv_heads, block, dim]


@dataclass
class Block:
    tokens: tuple[int, ...]  # checked on a hit: a hash collision can never serve another prefix
    keys: list[torch.Tensor]
    values: list[torch.Tensor]


@dataclass
class Hit:
    """A prompt's cached prefix: its length, and per layer its blocks' keys and values, in order."""

    tokens: int
    keys: list[list[torch.Tensor]]
    values: list[list[torch.Tensor]]


class PrefixCache:
    def __init__(self, capacity_tokens: int, block_size: int = BLOCK_SIZE):
        self.block_size = block_size
        self.capacity = capacity_tokens // block_size  # blocks
        self._blocks: collections.OrderedDict[int, Block] = collections.OrderedDict()  # LRU first
        self.queries = 0  # prompt tokens looked up (vLLM's prefix_cache_queries)
        self.hits = 0  # of them found (prefix_cache_hits)

    def __len__(self) -> int:
        return len(self._blocks)

    def _chain(self, ids: list[int], blocks: int) -> list[tuple[int, tuple[int, ...]]]:
        """(key, tokens) of the first `blocks` full blocks of ids."""
        chain, parent, size = [], 0, self.block_size
        for b in range(blocks):
            tokens = tuple(ids[b * size:(b + 1) * size])
            parent = hash((parent, tokens))
            chain.append((parent, tokens))
        return chain

    def first_block(self, ids: list[int]) -> int | None:
        """The key of the prompt's first block, where it has one to reuse."""
        chain = self._chain(ids, min(1, (len(ids) - 1) // self.block_size))
        return chain[0][0] if chain else None

    def lookup(self, ids: list[int]) -> Hit | None:
        """The longest cached prefix of ids that leaves at least one token to compute (the
        next token's logits come from it); counted in the hit rate."""
        self.queries += len(ids)
        found: list[tuple[int, Block]] = []
        for key, tokens in self._chain(ids, (len(ids) - 1) // self.block_size):
            block = self._blocks.get(key)
            if block is None or block.tokens != tokens:
                break
            found.append((key, block))
        if not found:
            return None
        self._touch([key for key, _ in found])
        self.hits += len(found) * self.block_size
        layers = range(len(found[0][1].keys))
        return Hit(len(found) * self.block_size, [[b.keys[i] for _, b in found] for i in layers],
                   [[b.values[i] for _, b in found] for i in layers])

    def insert(self, ids: list[int], computed: int, read: Callable[[int, int], BlockKV]) -> None:
        """Keep the full blocks among ids' first `computed` tokens (those whose keys and values
        are in the caller's cache) that are not cached yet; read(start, end) copies them out."""
        if not self.capacity:
            return
        chain = self._chain(ids, min(computed // self.block_size, self.capacity))
        for b, (key, tokens) in enumerate(chain):
            if key not in self._blocks or self._blocks[key].tokens != tokens:
                self._blocks[key] = Block(tokens, *read(b * self.block_size, (b + 1) * self.block_size))
        self._touch([key for key, _ in chain])
        while len(self._blocks) > self.capacity:
            self._blocks.popitem(last=False)

    def _touch(self, chain: list[int]) -> None:
        """Most recently used, the chain's first block last: a prefix outlives what follows it
        (which is of no use without it)."""
        for key in reversed(chain):
            self._blocks.move_to_end(key)

    def clear(self) -> None:
        self._blocks.clear()
