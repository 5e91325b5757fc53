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
(kv_manager.cached_prefix uses a prefix only as far as that window is still here).
"""
import collections

from .kv_pool import NULL_BLOCK


class WindowBlocks:
    def __init__(self, total: int, window: int, block_size: int):
        """total: window blocks, the null block not counted; window: the layers' window in keys."""
        self.total, self.window, self.block_size = total, window, block_size
        self.free = list(range(total, NULL_BLOCK, -1))  # the last freed handed out first
        self.of: dict[int, int] = {}  # a table block: its window block
        self.readers: collections.Counter[int] = collections.Counter()  # a table block: rows that read it
        self.idle: collections.OrderedDict[int, None] = collections.OrderedDict()  # blocks no row reads, oldest first

    def first_read(self, position: int) -> int:
        """The first table block that a query at `position` reads (its window's first key's)."""
        return max(0, position - self.window + 1) // self.block_size

    def available(self, keeping: list[int]) -> int:
        """Window blocks that can be lent now, `keeping`'s idle ones aside (they are about to be read)."""
        return len(self.free) + len(self.idle) - sum(1 for b in set(keeping) if b in self.idle)

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
                self.free.append(window_block)

    def table(self, table: list[int], first: int) -> list[int]:
        """A row's table as the window layers read it: the null block before `first` (the
        window has passed those)."""
        return [NULL_BLOCK] * first + [self.of[b] for b in table[first:]]

    def slot(self, slot: int) -> int:
        """A table slot (block * block_size + offset) in the window pool."""
        return self.of[slot // self.block_size] * self.block_size + slot % self.block_size

    def reset(self) -> None:
        """Every row gone (the loop failed: kv_manager.reset)."""
        self.free = list(range(self.total, NULL_BLOCK, -1))
        self.of.clear()
        self.readers.clear()
        self.idle.clear()

    @property
    def num_used(self) -> int:
        return self.total - len(self.free)

    def _lend(self) -> int:
        if self.free:
            return self.free.pop()
        oldest, _ = self.idle.popitem(last=False)
        return self.of.pop(oldest)
