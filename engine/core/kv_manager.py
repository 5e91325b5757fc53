"""Each row's block table, and automatic prefix caching over them (vLLM's KVCacheManager).

Only the scheduler calls the methods that change a table (start, grow, fork, free, computed,
reset); none of them writes a row's own state, which is the scheduler's too.

A row (one answer of a request) holds the blocks its history's keys and values are in. Its full
blocks are keyed as they fill (block_pool.py), prompt and answer alike, so a conversation's next
turn finds the previous answer too. A new request starts from the longest run of cached blocks
that its history begins with, holding them as its own first blocks: nothing is copied, and it
computes only the rest. Requests that share a system prompt share its blocks.

Reuse changes no number: the C kernels compute each token's keys and values, and each query's
attention, the same way whatever else is in the forward pass (paged_attention.c, quant_matmul.c),
so keys computed for one request, in a prefill or a decode step, are bit for bit those another
request would compute. (On the fallbacks, PyTorch's matmuls round by shape: there, as for
batching, the tokens are the same and the numbers within float rounding.)

Where the model has sliding-window layers, each table block that a row's window still reaches
has a window block too (window_blocks.py): every method below keeps both.
"""
from typing import Optional

from .block_pool import BlockPool, chain_hashes
from .kv_pool import KVPool
from .request import Request
from .window_blocks import WindowBlocks


class KVCacheManager:
    def __init__(self, pool: KVPool, caching: bool):
        self.pool = pool
        self.blocks = BlockPool(pool.blocks)
        self.block_size = pool.shape.block_size
        self.caching = caching
        self.tables: dict[str, list[int]] = {}
        self.windows = WindowBlocks(pool.window_blocks, pool.shape.window, self.block_size) if pool.window_blocks \
            else None
        self.first_read: dict[str, int] = {}  # each row's first table block its window layers still read
        self.block_keys: dict[str, list[int]] = {}  # each row's prefix-cache keys of its history's full blocks
        self.queries = 0  # prompt tokens looked up (vLLM's prefix_cache_queries)
        self.hits = 0  # of them found (prefix_cache_hits)

    @property
    def capacity(self) -> int:
        """Tokens the pool holds."""
        return self.blocks.total * self.block_size

    def table(self, req: Request) -> list[int]:
        return self.tables[req.row_id]

    def keys(self, req: Request) -> list[int]:
        """The keys of the full blocks of the row's history, extended as it grows."""
        keys = self.block_keys.setdefault(req.row_id, [])
        size, have = self.block_size, len(keys)
        if req.length // size > have:
            keys += chain_hashes(req.tokens(have * size, req.length // size * size), keys[-1] if have else None, size)
        return keys

    # ----- starting a row -----
    def cached_prefix(self, req: Request) -> list[int]:
        """The cached blocks that the row's history starts with, leaving at least one token to
        compute (the next token's logits come from it). Prompt scores need the whole prompt."""
        if not self.caching or (req.prompt_scores is not None and not req.prompt_scores.complete):
            return []
        tokens, size = req.history(), self.block_size
        found: list[int] = []
        for i, key in enumerate(self.keys(req)[:(len(tokens) - 1) // size]):
            block = self.blocks.lookup(key, tokens[i * size:(i + 1) * size])
            if block is None:
                break
            found.append(block)
        while self.windows and found and not self.windows.can_read(found[self.windows.first_read(len(found) * size):]):
            found.pop()  # its window layers' keys are gone: computed again
        return found

    def waits_for(self, req: Request, prefix: list[int], computing: set[int]) -> bool:
        """Whether the block after its cached prefix is one another row is computing right now:
        then it is better to wait for it, so users sending one system prompt at once compute it once."""
        keys = self.keys(req)
        return len(prefix) < len(keys) and keys[len(prefix)] in computing

    def computing(self, rows: list[Request]) -> set[int]:
        """The keys of the full blocks that these rows are still to compute."""
        size = self.block_size
        return {key for req in rows if req.todo > 1
                for key in self.keys(req)[req.computed // size:]}

    def start(self, req: Request, prefix: list[int], tokens: int, reserve: int = 0) -> Optional[list[int]]:
        """Give a row its cached prefix and room for `tokens` after it, and `reserve` blocks more
        (returned: the blocks its answers will fork into); None (nothing taken) when the pool
        lacks the blocks. The row's tokens in its prefix are computed (len(prefix) * block_size)."""
        evictable = sum(1 for block in prefix if self.blocks.refs[block] == 0)  # free now, held once started
        need = self._blocks_for(len(prefix) * self.block_size + tokens) - len(prefix)
        if need + reserve > self.blocks.num_free - evictable:
            return None
        first = self.windows.first_read(len(prefix) * self.block_size) if self.windows else 0
        if self.windows and need + reserve > self.windows.available(prefix[first:]):
            return None
        self.blocks.acquire(prefix)
        table = prefix + self._allocate(need)
        reserved = self._allocate(reserve)
        if self.windows:  # the prefix's window is there (cached_prefix); the new blocks' are counted above
            assert not self.windows.missing(prefix[first:]), "a cached prefix's window is there"
            self.first_read[req.row_id] = first
            self._read(table[first:] + reserved)
        self.tables[req.row_id] = table
        return reserved

    def count_lookup(self, req: Request, cached: int) -> None:
        """A request's first start: its prompt counts in the hit rate."""
        if self.caching:
            self.queries += len(req.prompt_ids)
            self.hits += cached

    def fork(self, parent: Request, child: Request, reserved: Optional[int]) -> None:
        """Another answer to the parent's prompt (all of it computed): its full blocks shared,
        its last one copied into the block reserved for it (each answer writes its own tokens
        there)."""
        table, full = self.table(parent), parent.computed // self.block_size
        own: list[int] = []
        if parent.computed % self.block_size:
            assert reserved is not None, "a partial last block needs the block reserved at admission"
            own = [reserved]
            self.pool.copy_block(table[full], reserved)
            if self.windows:
                self.pool.copy_block(self.windows.of[table[full]], self.windows.of[reserved], windowed=True)
        elif reserved is not None:
            self.release([reserved])
        self.blocks.acquire(table[:full])
        self.tables[child.row_id] = table[:full] + own
        self.block_keys[child.row_id] = list(self.keys(parent))
        if self.windows:  # the reserved block is read already (start)
            first = self.first_read[child.row_id] = self.first_read[parent.row_id]
            self._read(table[first:full])  # the parent reads them: none is missing

    def release(self, blocks: list[int]) -> None:
        """Blocks held outside any table (reserved for a fork) go back."""
        if self.windows:
            self.windows.unread(blocks)
        self.blocks.release(blocks)

    # ----- a row's steps -----
    def grow(self, req: Request, tokens: int) -> bool:
        """Room for `tokens` more after what the row has computed; False when the pool lacks it."""
        table = self.table(req)
        need = self._blocks_for(req.computed + tokens) - len(table)
        if need <= 0:
            return True
        new = self._take(need)
        if new is None:
            return False
        table += new
        return True

    def window_table(self, req: Request) -> list[int]:
        """The row's table as its window layers read it (window_blocks.py)."""
        assert self.windows is not None
        return self.windows.table(self.table(req), self.first_read[req.row_id])

    def window_slot(self, slot: int) -> int:
        """A slot of `slots` in the window pool."""
        assert self.windows is not None
        return self.windows.slot(slot)

    def slots(self, req: Request, start: int, count: int) -> list[int]:
        """Where tokens start.. of the row go: block * block_size + offset."""
        table, size = self.table(req), self.block_size
        return [table[p // size] * size + p % size for p in range(start, start + count)]

    def computed(self, req: Request, before: int) -> None:
        """The row computed tokens before..req.computed: key the blocks they filled, and let its
        window layers' blocks that the window has passed go."""
        size = self.block_size
        if self.windows:
            first, now = self.first_read[req.row_id], self.windows.first_read(req.computed)
            if now > first:
                self.windows.unread(self.table(req)[first:now])
                self.first_read[req.row_id] = now
        if not self.caching or before // size == req.computed // size:
            return
        table, keys = self.table(req), self.keys(req)
        for i in range(before // size, req.computed // size):
            self.blocks.remember(table[i], keys[i], req.tokens(i * size, (i + 1) * size))

    def free(self, req: Request) -> None:
        """The row is done (finished, failed, aborted or preempted): its blocks go back."""
        table = self.tables.pop(req.row_id, None)
        self.block_keys.pop(req.row_id, None)
        first = self.first_read.pop(req.row_id, 0)
        if table:
            if self.windows:
                self.windows.unread(table[first:])
            self.blocks.release(table)

    def lend(self, count: int) -> Optional[list[int]]:
        """Blocks held outside any row (the start-up probe's), window blocks and all; None when
        the pool lacks them. `take_back` takes them back."""
        return self._take(count)

    def take_back(self, blocks: list[int]) -> None:
        """Blocks that `lend` gave."""
        self.release(blocks)

    def _allocate(self, count: int) -> list[int]:
        """`count` blocks (there are: the caller counted); their window blocks, if any, are no one's."""
        blocks = self.blocks.allocate(count) or []
        assert len(blocks) == count, "counted before"
        if self.windows:
            self.windows.forget(blocks)
        return blocks

    def _take(self, count: int) -> Optional[list[int]]:
        """`count` new blocks, read (window blocks and all) from now on; None where either pool
        lacks room for them (nothing is evicted for them)."""
        if count > self.blocks.num_free or (self.windows and count > self.windows.available([])):
            return None
        blocks = self._allocate(count)
        self._read(blocks)
        return blocks

    def _read(self, blocks: list[int]) -> None:
        """A row (or `lend`) reads these blocks' window blocks from now on; the caller counted them."""
        if self.windows:
            read = self.windows.read(blocks)
            assert read, "counted before"

    def reset(self) -> None:
        """Every row gone and the cache emptied (after the loop itself failed: trust nothing)."""
        self.blocks = BlockPool(self.pool.blocks)
        self.tables.clear()
        self.block_keys.clear()
        self.first_read.clear()
        if self.windows:
            self.windows.reset()

    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def stats(self) -> dict:
        return {"kv_blocks": self.blocks.total, "kv_blocks_used": self.blocks.num_used,
                "prefix_cache_blocks": len(self.blocks.cached), "prefix_cache_queries": self.queries,
                "prefix_cache_hits": self.hits,
                **({"kv_window_blocks": self.windows.total, "kv_window_blocks_used": self.windows.num_used}
                   if self.windows else {})}
