"""One KV manager per attention kind (vLLM v1's single-type managers), each behind one interface.

A row has one block table (kv_manager.py, the coordinator): its blocks come from one BlockPool,
which keys them for the prefix cache. Each KV cache group (kv_pool.py: the layers of one kind)
keeps its keys by those table blocks in its own way, and its manager answers for it:

- FullAttentionManager: the full-attention layers keep a block's keys in that very block, so
  its table is the row's table, and its room is the BlockPool's;
- SlidingWindowManager (window_blocks.py): the window layers keep them in window blocks lent to
  the table blocks that a row's window still reaches, and given back as the window passes them.

The coordinator calls every group's manager alike and never asks which kind it is; the kind
is chosen here, once, from the group (`managers_for`).
"""
from typing import Protocol

from .block_pool import BlockPool
from .kv_pool import KVGroup, KVPool
from .window_blocks import SlidingWindowManager

__all__ = ["FullAttentionManager", "GroupManager", "SlidingWindowManager", "managers_for"]


class GroupManager(Protocol):
    """What the coordinator asks of a KV cache group. `table` arguments are a row's table (the
    BlockPool's blocks); a group maps them to blocks of its own pool."""

    group: KVGroup

    def cached(self, prefix: list[int]) -> int:
        """How many of a cached prefix's first blocks this group still has the keys of, as far as
        the prefix's next query reads them (the prefix cache uses no more)."""
        ...

    def can_fit(self, prefix: list[int], count: int) -> bool:
        """Whether a row that starts from `prefix` (cached blocks it will hold) has room here for
        `count` new blocks (nothing is evicted for them)."""
        ...

    def handed_out(self, blocks: list[int]) -> None:
        """The BlockPool handed these blocks out anew: whatever this group kept for them is no one's."""
        ...

    def start(self, row: str, table: list[int], cached: int, reserved: list[int]) -> None:
        """A row starts with this table (its first `cached` blocks a cached prefix) and `reserved`
        blocks held for its forks; `can_fit` counted the room."""
        ...

    def hold(self, blocks: list[int]) -> None:
        """A row (or a loan) reads these new blocks from now on; `can_fit` counted the room."""
        ...

    def fork(self, parent: str, child: str, shared: list[int]) -> None:
        """A child row shares its parent's first blocks (`shared`, all computed)."""
        ...

    def copy_block(self, source: int, target: int) -> None:
        """This group's keys and values of one table block into another's (a fork's last block)."""
        ...

    def passed(self, row: str, table: list[int], computed: int) -> None:
        """The row has `computed` tokens: what its next queries no longer read may go."""
        ...

    def release(self, blocks: list[int]) -> None:
        """Blocks held outside any table (reserved for a fork, or lent) go back."""
        ...

    def free(self, row: str, table: list[int]) -> None:
        """The row is done: all it held goes back."""
        ...

    def table(self, row: str, table: list[int]) -> list[int]:
        """The row's table as this group's layers read it: blocks of this group's pool."""
        ...

    def slots(self, slots: list[int]) -> list[int]:
        """Table slots (block * block_size + offset) in this group's pool."""
        ...

    def reset(self) -> None:
        """Every row gone (the loop failed: trust nothing)."""
        ...

    def stats(self) -> dict[str, int]:
        """What this group adds to the engine's stats."""
        ...


class FullAttentionManager:
    """Full-attention layers: a table block's keys are in that same block of the group's pool,
    so the table and its slots are the row's own, and only the BlockPool bounds the room."""

    def __init__(self, pool: KVPool, index: int, blocks: BlockPool):
        self.pool, self.index, self.group, self.blocks = pool, index, pool.groups[index], blocks

    def cached(self, prefix: list[int]) -> int:
        return len(prefix)  # every key stays as long as its block is cached

    def can_fit(self, prefix: list[int], count: int) -> bool:
        evictable = sum(1 for block in prefix if self.blocks.refs[block] == 0)  # free now, held once started
        return count <= self.blocks.num_free - evictable

    def handed_out(self, blocks: list[int]) -> None:
        pass

    def start(self, row: str, table: list[int], cached: int, reserved: list[int]) -> None:
        pass

    def hold(self, blocks: list[int]) -> None:
        pass

    def fork(self, parent: str, child: str, shared: list[int]) -> None:
        pass

    def copy_block(self, source: int, target: int) -> None:
        self.pool.copy_block(self.index, source, target)

    def passed(self, row: str, table: list[int], computed: int) -> None:
        pass  # a full-attention query reads every key before it

    def release(self, blocks: list[int]) -> None:
        pass

    def free(self, row: str, table: list[int]) -> None:
        pass

    def table(self, row: str, table: list[int]) -> list[int]:
        return table

    def slots(self, slots: list[int]) -> list[int]:
        return slots

    def reset(self) -> None:
        pass

    def stats(self) -> dict[str, int]:
        return {}


def managers_for(pool: KVPool, blocks: BlockPool) -> list[GroupManager]:
    """A manager for each of the pool's KV cache groups, in its order, by the group's kind."""
    return [SlidingWindowManager(pool, index) if group.window else FullAttentionManager(pool, index, blocks)
            for index, group in enumerate(pool.groups)]
