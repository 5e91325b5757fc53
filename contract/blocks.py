"""The prefix cache's unit, shared by the engine (which keys its KV blocks with it) and the
gateway's router (which predicts from it which replica holds a prompt's blocks).

A full block of BLOCK_SIZE tokens is keyed by the hash of its tokens and of its parent block's key
(a hash chain), so a key stands for the whole prefix up to the block's end. The hash is
transformers' `compute_block_hash` (blake2b of the parent key and the tokens as int32), written
here with the standard library so that the gateway computes it without loading the engine; a test
keeps the two equal.
"""
import hashlib
from array import array
from typing import Optional

BLOCK_SIZE = 16  # tokens per block (vLLM's default on GPUs), and the prefix cache's unit


def block_hash(parent: Optional[int], tokens: list[int]) -> int:
    h = hashlib.blake2b(digest_size=8)
    if parent is not None:
        h.update(parent.to_bytes(8, "little", signed=False))
    h.update(array("i", tokens).tobytes())
    return int.from_bytes(h.digest(), "little", signed=False)


def adapter_root(adapter: Optional[str]) -> Optional[int]:
    """The parent key of a row's first block: none for the base model; for a LoRA adapter, a key of
    its name, so that its blocks (whose keys and values the adapter changed) are never another's."""
    return None if adapter is None else block_hash(None, list(adapter.encode()))


def chain_hashes(tokens: list[int], parent: Optional[int] = None, block_size: int = BLOCK_SIZE) -> list[int]:
    """The keys of the full blocks of `tokens`, after a block keyed `parent` (None: the start)."""
    keys = []
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = block_hash(parent, tokens[start:start + block_size])
        keys.append(parent)
    return keys
