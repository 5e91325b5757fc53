"""The blocks of a model's sliding-window layers: what bounds the keys such a layer keeps.

Layers that attend over a sliding window (Gemma 2 and 3's local layers, Mistral's, Qwen's upper
layers) read only a sequence's last `window` keys. Their keys and values live in a pool of their
own (kv_pool.py), in window blocks lent to the blocks of a row's table: the window layers' keys
of table block b are in window block `of[b]`. A row holds a window block only while its next
query can still read it; a block that the window has passed goes back. However long a row
grows, it holds about window / block_size window blocks, and the window layers' memory is
bounded by the rows that run, not by their lengths (vLLM's sliding-window manager keeps a table
of its own for the same end).

A block that no row reads any more keeps its window block, idle, until the pool needs it (the
one idle longest first): the prefix cache then still finds a cached prefix's last window
(`cached`: the coordinator uses a prefix only as far as that window is still here).
"""
import collections

from .kv_pool import NULL_BLOCK, KVPool


class SlidingWindowManager:
    """The window group's manager (kv_groups.py's interface): window blocks lent to table blocks,
    and each row's first table block that its window still reaches."""

    def __init__(self, pool: KVPool, index: int):
        self.pool, self.index, self.group = pool, index, pool.groups[index]
        self.total, self.window, self.block_size = self.group.blocks, self.group.window, pool.shape.block_size
        self.spare = list(range(self.total, NULL_BLOCK, -1))  # the last freed handed out first
        self.of: dict[int, int] = {}  # a table block: its window block
        self.readers: collections.Counter[int] = collections.Counter()  # a table block: rows that read it
        self.idle: collections.OrderedDict[int, None] = collections.OrderedDict()  # blocks no row reads, oldest first
        self.first: dict[str, int] = {}  # each row's first table block that its window still reaches

    # ----- the interface -----
    def cached(self, prefix: list[int]) -> int:
        """A cached prefix is used as far as its last window's blocks are still lent (the keys of
        the others are gone: computed again)."""
        count = len(prefix)
        while count and not self.can_read(prefix[self.first_read(count * self.block_size):count]):
            count -= 1
        return count

    def can_fit(self, prefix: list[int], count: int) -> bool:
        return count <= self.available(prefix[self.first_read(len(prefix) * self.block_size):])

    def handed_out(self, blocks: list[int]) -> None:
        self.forget(blocks)

    def start(self, row: str, table: list[int], cached: int, reserved: list[int]) -> None:
        """The cached prefix's window is there (`cached`); the new blocks' were counted (`can_fit`)."""
        first = self.first_read(cached * self.block_size)
        assert not self.missing(table[first:cached]), "a cached prefix's window is there"
        self.first[row] = first
        self.hold(table[first:] + reserved)

    def hold(self, blocks: list[int]) -> None:
        assert self.read(blocks), "counted before"

    def fork(self, parent: str, child: str, shared: list[int]) -> None:
        """The child reads what its parent reads of them (none is missing)."""
        first = self.first[child] = self.first[parent]
        self.hold(shared[first:])

    def copy_block(self, source: int, target: int) -> None:
        self.pool.copy_block(self.index, self.of[source], self.of[target])

    def passed(self, row: str, table: list[int], computed: int) -> None:
        """The blocks that the window has passed go back (idle, still cached)."""
        first, now = self.first[row], self.first_read(computed)
        if now > first:
            self.unread(table[first:now])
            self.first[row] = now

    def release(self, blocks: list[int]) -> None:
        self.unread(blocks)

    def free(self, row: str, table: list[int]) -> None:
        self.unread(table[self.first.pop(row, 0):])

    def table(self, row: str, table: list[int]) -> list[int]:
        """The null block before the row's first read block (the window has passed those)."""
        first = self.first[row]
        return [NULL_BLOCK] * first + [self.of[b] for b in table[first:]]

    def slots(self, slots: list[int]) -> list[int]:
        size = self.block_size
        return [self.of[slot // size] * size + slot % size for slot in slots]

    def reset(self) -> None:
        self.spare = list(range(self.total, NULL_BLOCK, -1))
        self.of.clear()
        self.readers.clear()
        self.idle.clear()
        self.first.clear()

    def stats(self) -> dict[str, int]:
        return {"kv_window_blocks": self.total, "kv_window_blocks_used": self.num_used}

    # ----- the window blocks -----
    def first_read(self, position: int) -> int:
        """The first table block that a query at `position` reads (its window's first key's)."""
        return max(0, position - self.window + 1) // self.block_size

    def available(self, keeping: list[int]) -> int:
        """Window blocks that can be lent now, `keeping`'s idle ones aside (they are about to be read)."""
        return len(self.spare) + len(self.idle) - sum(1 for b in set(keeping) if b in self.idle)

    def missing(self, blocks: list[int]) -> int:
        """Of these table blocks, those that have no window block."""
        return sum(1 for b in set(blocks) if b not in self.of)

    def can_read(self, blocks: list[int]) -> bool:
        """Whether all these table blocks still have their window blocks."""
        return all(b in self.of for b in blocks)

    def read(self, blocks: list[int]) -> bool:
        """A row reads these table blocks from now on: each gets a window block where it has none;
        False, and nothing changed, when the pool lacks them."""
        if self.missing(blocks) > self.available(blocks):
            return False
        for block in blocks:
            self.idle.pop(block, None)
            self.readers[block] += 1
        for block in blocks:
            if block not in self.of:
                self.of[block] = self._lend()
        return True

    def unread(self, blocks: list[int]) -> None:
        """A row reads these table blocks no more (the window passed them, or it is done)."""
        for block in blocks:
            self.readers[block] -= 1
            if self.readers[block] == 0:
                del self.readers[block]
                self.idle[block] = None

    def forget(self, blocks: list[int]) -> None:
        """These table blocks were handed out anew: what their window blocks held is no one's."""
        for block in blocks:
            assert block not in self.readers, "a block handed out anew is read by no row"
            self.idle.pop(block, None)
            window_block = self.of.pop(block, None)
            if window_block is not None:
                self.spare.append(window_block)

    @property
    def num_used(self) -> int:
        return self.total - len(self.spare)

    def _lend(self) -> int:
        if self.spare:
            return self.spare.pop()
        oldest, _ = self.idle.popitem(last=False)
        return self.of.pop(oldest)
