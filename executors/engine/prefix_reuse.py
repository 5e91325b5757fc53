"""The engine's side of prefix caching (prefix_cache.py holds the blocks): which prefilling
requests start from a cached prefix, which wait for one being computed, and what the cache is
offered after a prefill and after an answer."""
from typing import Optional

from transformers import DynamicCache

from .kv_batch import SlabLayer, new_cache, slabs
from .prefix_cache import BlockKV, PrefixCache
from .request import Request


class PrefixReuse:
    """Does nothing when the cache is off (`cache` None)."""

    def __init__(self, cache: Optional[PrefixCache]):
        self.cache = cache

    @property
    def on(self) -> bool:
        return self.cache is not None

    def ready(self, prefilling: list[Request]) -> list[Request]:
        """The prefilling requests, each started from its longest cached prefix when it first
        comes up, but those whose first block an earlier prompt is computing right now: they
        wait for it, so users who send one system prompt at once compute it once."""
        if self.cache is None:
            return list(prefilling)
        ready, computing = [], set()
        for req in prefilling:
            first = self.cache.first_block(req.prompt_ids)
            if not req.looked_up:
                if first is not None and first in computing:
                    continue
                req.looked_up = True
                self._reuse(req, self.cache)
            if first is not None and req.cached_tokens == 0:
                computing.add(first)
            ready.append(req)
        return ready

    @staticmethod
    def _reuse(req: Request, cache: PrefixCache) -> None:
        """Start from the longest cached prefix of the prompt: the rest is prefilled as a chunk
        after it. (Prompt scores need the whole prompt's prefill.)"""
        if req.prompt_scores is not None:
            return
        hit = cache.lookup(req.prompt_ids)
        if hit is None:
            return
        kv = new_cache()
        kv.layers = [SlabLayer.from_blocks(keys, values) for keys, values in zip(hit.keys, hit.values, strict=True)]
        req.cache, req.prefilled, req.cached_tokens = kv, hit.tokens, hit.tokens

    def remember(self, ids: list[int], computed: int, kv: DynamicCache, row: int, offset: int) -> None:
        """Offer the cache what a KV row holds: ids[:computed], from column `offset` on."""
        if self.cache is None:
            return

        def read(start: int, end: int) -> BlockKV:
            layers = slabs(kv)
            return ([layer.keys[row, :, offset + start:offset + end].clone() for layer in layers],
                    [layer.values[row, :, offset + start:offset + end].clone() for layer in layers])
        self.cache.insert(ids, computed, read)

    def stats(self) -> dict:
        cache = self.cache
        return {"prefix_cache_blocks": len(cache) if cache else 0, "prefix_cache_queries": cache.queries if cache else 0,
                "prefix_cache_hits": cache.hits if cache else 0}
