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

The model's layers are split in KV cache groups by attention kind (kv_pool.py), each with a
manager of its own (kv_groups.py); this coordinator (vLLM v1's KVCacheCoordinator) holds the
row's one table and calls every group's manager alike: each can refuse room, drop the end of a
cached prefix whose keys it no longer has, and give back what a row's next queries no longer
read. The step reads each group's table and slots (`group_tables`, `group_slots`).
"""
from typing import Optional

from contract.blocks import adapter_root

from .block_pool import BlockPool, chain_hashes
from .kv_groups import GroupManager, managers_for
from .kv_pool import KVPool
from .request import Request


class KVCacheManager:
    def __init__(self, pool: KVPool, caching: bool):
        self.pool = pool
        self.blocks = BlockPool(pool.blocks)
        self.block_size = pool.shape.block_size
        self.caching = caching
        self.tables: dict[str, list[int]] = {}
        self.groups: list[GroupManager] = managers_for(pool, self.blocks)  # one per KV cache group, in the pool's order
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
            parent = keys[-1] if have else adapter_root(req.adapter)  # an adapter's blocks are its own
            keys += chain_hashes(req.tokens(have * size, req.length // size * size), parent, size)
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
        usable = len(found)  # as far as every group still has the keys (a group's answer may shorten another's)
        while (least := min(group.cached(found[:usable]) for group in self.groups)) < usable:
            usable = least
        return found[:usable]

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
        need = self._blocks_for(len(prefix) * self.block_size + tokens) - len(prefix)
        if not all(group.can_fit(prefix, need + reserve) for group in self.groups):
            return None
        self.blocks.acquire(prefix)
        table = prefix + self._allocate(need)
        reserved = self._allocate(reserve)
        for group in self.groups:
            group.start(req.row_id, table, len(prefix), reserved)
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
            for group in self.groups:
                group.copy_block(table[full], reserved)
        elif reserved is not None:
            self.release([reserved])
        self.blocks.acquire(table[:full])
        self.tables[child.row_id] = table[:full] + own
        self.block_keys[child.row_id] = list(self.keys(parent))
        for group in self.groups:  # the reserved block is held already (start)
            group.fork(parent.row_id, child.row_id, table[:full])

    def release(self, blocks: list[int]) -> None:
        """Blocks held outside any table (reserved for a fork) go back."""
        for group in self.groups:
            group.release(blocks)
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

    def group_tables(self, req: Request) -> list[list[int]]:
        """The row's table as each group's layers read it, in the pool's group order."""
        table = self.table(req)
        return [group.table(req.row_id, table) for group in self.groups]

    def group_slots(self, slots: list[int]) -> list[list[int]]:
        """Slots of the table (`slots`) in each group's pool, in the pool's group order."""
        return [group.slots(slots) for group in self.groups]

    def slots(self, req: Request, start: int, count: int) -> list[int]:
        """Where tokens start.. of the row go: block * block_size + offset."""
        table, size = self.table(req), self.block_size
        return [table[p // size] * size + p % size for p in range(start, start + count)]

    def computed(self, req: Request, before: int) -> None:
        """The row computed tokens before..req.computed: key the blocks they filled, and let each
        group give back what the row's next queries no longer read."""
        size, table = self.block_size, self.table(req)
        for group in self.groups:
            group.passed(req.row_id, table, req.computed)
        if not self.caching or before // size == req.computed // size:
            return
        keys = self.keys(req)
        for i in range(before // size, req.computed // size):
            self.blocks.remember(table[i], keys[i], req.tokens(i * size, (i + 1) * size))

    def free(self, req: Request) -> None:
        """The row is done (finished, failed, aborted or preempted): its blocks go back."""
        table = self.tables.pop(req.row_id, None) or []
        self.block_keys.pop(req.row_id, None)
        for group in self.groups:
            group.free(req.row_id, table)
        self.blocks.release(table)

    def lend(self, count: int) -> Optional[list[int]]:
        """Blocks held outside any row (the start-up probe's), in every group; None when
        the pool lacks them. `take_back` takes them back."""
        return self._take(count)

    def take_back(self, blocks: list[int]) -> None:
        """Blocks that `lend` gave."""
        self.release(blocks)

    def _allocate(self, count: int) -> list[int]:
        """`count` blocks (there are: the caller counted); what a group kept for them is no one's."""
        blocks = self.blocks.allocate(count) or []
        assert len(blocks) == count, "counted before"
        for group in self.groups:
            group.handed_out(blocks)
        return blocks

    def _take(self, count: int) -> Optional[list[int]]:
        """`count` new blocks, held in every group from now on; None where a group lacks room for
        them (nothing is evicted for them)."""
        if not all(group.can_fit([], count) for group in self.groups):
            return None
        blocks = self._allocate(count)
        for group in self.groups:
            group.hold(blocks)
        return blocks

    def reset(self) -> None:
        """Every row gone and the cache emptied (after the loop itself failed: trust nothing)."""
        self.blocks.reset()
        self.tables.clear()
        self.block_keys.clear()
        for group in self.groups:
            group.reset()

    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def stats(self) -> dict:
        stats = {"kv_blocks": self.blocks.total, "kv_blocks_used": self.blocks.num_used,
                 "prefix_cache_blocks": len(self.blocks.cached), "prefix_cache_queries": self.queries,
                 "prefix_cache_hits": self.hits}
        for group in self.groups:
            stats.update(group.stats())
        return stats
