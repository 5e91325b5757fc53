"""Which KV blocks are free, who holds each, and which hold a cached prefix (vLLM's BlockPool).

A block is held by every request whose block table lists it (a reference count): requests that
share a prefix share its blocks. A full block is keyed by the hash of its tokens and of its
parent block (a hash chain), so it is only ever reused after the same whole prefix. When no
request holds it any more, a keyed block stays cached among the free ones, and goes only when
the pool needs room, least recently used first. A block freed without a key (a request's last,
partial block) is of no use to anyone and is handed out first.
"""
import collections
from dataclasses import dataclass
from typing import Optional

from contract.blocks import chain_hashes

from .kv_pool import NULL_BLOCK

__all__ = ["BlockPool", "CachedBlock", "chain_hashes"]


@dataclass
class CachedBlock:
    block: int
    tokens: tuple[int, ...]  # checked on a hit: a hash collision never serves another prefix


class BlockPool:
    def __init__(self, blocks: int):
        """blocks: the pool's size, the null block included (never handed out)."""
        self.total = blocks - 1
        self.reset()

    def reset(self) -> None:
        """Every block free and nothing cached, in place (the group managers hold this pool)."""
        blocks = self.total + 1
        self.refs = [0] * blocks
        self.key_of: list[Optional[int]] = [None] * blocks
        self.cached: dict[int, CachedBlock] = {}
        # free blocks, next to be handed out first; held blocks are not in it
        self.free: collections.OrderedDict[int, None] = collections.OrderedDict.fromkeys(
            b for b in range(blocks) if b != NULL_BLOCK)

    @property
    def num_free(self) -> int:
        """Blocks that can be handed out, cached ones included."""
        return len(self.free)

    @property
    def num_used(self) -> int:
        return self.total - len(self.free)

    def lookup(self, key: int, tokens: list[int]) -> Optional[int]:
        """The block cached under this key, if it holds these tokens."""
        hit = self.cached.get(key)
        return hit.block if hit is not None and list(hit.tokens) == tokens else None

    def allocate(self, count: int) -> Optional[list[int]]:
        """`count` blocks, now held once each; None (and nothing taken) when there are not
        enough. A cached block handed out loses its key."""
        if count > len(self.free):
            return None
        blocks = []
        for _ in range(count):
            block, _ = self.free.popitem(last=False)
            self._forget(block)
            self.refs[block] = 1
            blocks.append(block)
        return blocks

    def acquire(self, blocks: list[int]) -> None:
        """Hold these (cached, or held by another request) blocks once more."""
        for block in blocks:
            if self.refs[block] == 0:
                del self.free[block]
            self.refs[block] += 1

    def release(self, blocks: list[int]) -> None:
        """Let go of a request's blocks, given in table order: the last ones go back first, so
        that a prefix outlives what follows it (which is of no use without it)."""
        for block in reversed(blocks):
            self.refs[block] -= 1
            if self.refs[block] == 0:
                self.free[block] = None
                if self.key_of[block] is None:  # nobody will look for it: the next handed out
                    self.free.move_to_end(block, last=False)

    def remember(self, block: int, key: int, tokens: list[int]) -> None:
        """Key a full block, unless another block is cached under that key already."""
        if self.key_of[block] is None and key not in self.cached:
            self.cached[key] = CachedBlock(block, tuple(tokens))
            self.key_of[block] = key

    def _forget(self, block: int) -> None:
        key = self.key_of[block]
        if key is not None:
            del self.cached[key]
            self.key_of[block] = None

    def clear_cache(self) -> None:
        for block in list(self.free):
            self._forget(block)
