"""One KV manager per attention kind behind one coordinator: the coordinator knows no kind, each
manager is tested alone, and a step hands each layer its own group's slots and tables."""
import ctypes
import inspect

import pytest
import torch

from engine.core import kv_manager
from engine.core.block_pool import BlockPool
from engine.core.kv_groups import FullAttentionManager, SlidingWindowManager, managers_for
from engine.core.kv_pool import NULL_BLOCK, KVPool, KVShape
from engine.kernels import llama_layer
from engine.model.paged_attention import PagedStep

B = 4  # tokens per block in these tests


def pool(window_blocks: int = 4, window: int = 6, blocks: int = 20) -> KVPool:
    """Layers 0 and 2 keep every key, layer 1 only its last `window` (in `window_blocks` of its own)."""
    shape = KVShape(layers=3, kv_heads=1, head_dim=2, dtype=torch.float32, block_size=B, windows=(0, window, 0))
    return KVPool(shape, blocks, torch.device("cpu"), window_blocks)


def test_the_coordinator_knows_no_attention_kind():
    """Every kind's handling is its manager's: the coordinator names none, and calls them all alike."""
    source = inspect.getsource(kv_manager)
    assert "window" not in source.lower() and "FullAttention" not in source
    plain = KVPool(KVShape(layers=2, kv_heads=1, head_dim=2, dtype=torch.float32, block_size=B), 8,
                   torch.device("cpu"))
    assert [type(m) for m in kv_manager.KVCacheManager(plain, True).groups] == [FullAttentionManager]
    kinds = [type(m) for m in kv_manager.KVCacheManager(pool(), True).groups]
    assert kinds == [FullAttentionManager, SlidingWindowManager]


def test_the_pool_keeps_each_group_in_tensors_of_its_own():
    kv = pool()
    assert [(g.layers, g.window, g.blocks) for g in kv.groups] == [((0, 2), 0, 20), ((1,), 6, 4)]
    assert [kv.group_of(layer) for layer in range(3)] == [0, 1, 0]
    assert kv.layer(1)[0].shape[0] == 5 and kv.layer(2)[0].shape[0] == 21
    assert kv.layer(2)[0].data_ptr() == kv.group_keys[0][1].data_ptr()  # the full group's second layer
    kv.group_keys[1][0, 3] = 1.0
    kv.copy_block(1, 3, 2)
    assert bool((kv.group_keys[1][0, 2] == 1.0).all()) and not bool((kv.group_keys[0] == 1.0).any())


def test_a_full_attention_manager_reads_the_tables_own_blocks():
    blocks = BlockPool(6)
    full = FullAttentionManager(pool(), 0, blocks)
    table = blocks.allocate(2)
    assert table is not None
    assert full.table("a", table) == table and full.slots([5, 9]) == [5, 9] and full.cached(table) == 2
    assert full.can_fit([], 3) and not full.can_fit([], 4)
    blocks.release(table)  # free now (cached ones stay so): a prefix that holds them leaves the rest
    assert full.can_fit(table, 3) and not full.can_fit(table, 4) and full.stats() == {}


def test_a_window_manager_lends_a_block_only_while_the_window_reaches_it():
    window = SlidingWindowManager(pool(window_blocks=4, window=6), 1)
    table = [7, 8, 9]  # the row's table blocks (the coordinator's): 12 tokens
    assert window.can_fit([], 4) and not window.can_fit([], 5)
    window.handed_out(table)
    window.start("a", table, 0, [])
    lent = window.table("a", table)
    assert NULL_BLOCK not in lent and len(set(lent)) == 3 and window.num_used == 3
    assert window.slots([9 * B + 2]) == [lent[2] * B + 2]
    window.passed("a", table, 10)  # the next query (position 10) reads keys 5 to 10: blocks 1 and 2
    assert window.table("a", table) == [NULL_BLOCK] + lent[1:] and set(window.readers) == {8, 9}
    assert window.num_used == 3 and window.can_fit([], 2) and not window.can_fit([], 3)  # one free, block 7's idle
    window.free("a", table)
    assert not window.readers and window.stats() == {"kv_window_blocks": 4, "kv_window_blocks_used": 3}


def test_a_window_manager_serves_a_cached_prefix_as_far_as_its_last_window_remains():
    window = SlidingWindowManager(pool(window_blocks=4, window=6), 1)
    prefix = [1, 2, 3, 4]  # 16 tokens: the next query (position 16) reads blocks 2 and 3
    window.handed_out(prefix)
    window.start("a", prefix, 0, [])
    window.passed("a", prefix, 16)
    window.free("a", prefix)
    assert window.cached(prefix) == 4  # the last window's blocks are still lent, idle
    window.handed_out([3])  # table block 3 handed out anew: its window block is no one's
    assert window.cached(prefix) == 2 and window.num_used == 3  # the windows after 2 blocks read block 3
    assert window.can_fit(prefix[:2], 2) and not window.can_fit(prefix[:2], 3)  # blocks 1's and 2's are kept
    window.handed_out([10, 11, 12, 13])
    window.start("b", [10, 11, 12, 13], 0, [])  # the free block, then the idlest: 1's, 2's, 4's
    assert window.cached(prefix) == 0 and not window.can_fit([], 1)
    window.reset()
    assert window.num_used == 0 and window.cached(prefix) == 0 and window.can_fit([], 4)

def test_a_forked_row_reads_its_parents_window_and_its_own_last_block():
    kv = pool(window_blocks=6)
    window = SlidingWindowManager(kv, 1)
    table, reserved = [1, 2, 3], [4]
    window.handed_out(table + reserved)
    window.start("parent", table, 0, reserved)
    window.passed("parent", table, 10)
    kv.group_keys[1][0, window.table("parent", table)[2]] = 2.0
    window.copy_block(3, 4)
    window.fork("parent", "child", table[:2])
    child = table[:2] + reserved
    assert window.table("child", child)[0] == NULL_BLOCK and window.readers == {2: 2, 3: 1, 4: 1}
    assert bool((kv.group_keys[1][0, window.table("child", child)[2]] == 2.0).all())


def test_each_layer_reads_its_own_groups_slots_and_tables():
    kv = pool()
    managers = managers_for(kv, BlockPool(kv.blocks))
    assert [type(m) for m in managers] == [FullAttentionManager, SlidingWindowManager]
    groups = [(torch.tensor([9]), [[1, 2, 3]]), (torch.tensor([5]), [[0, 4, 1]])]
    step = PagedStep.grouped(kv, [1], [10], groups)
    assert [step.of_layer(layer).tables for layer in range(3)] == [[[1, 2, 3]], [[0, 4, 1]], [[1, 2, 3]]]
    assert step.of_layer(1).counted is step.counted
    with pytest.raises(AssertionError):
        PagedStep(kv, torch.tensor([9]), [1], [10], [[1, 2, 3]]).of_layer(1)  # a lone group of two
    c_step = step.native_step  # kernels.h's LlamaStep: the full group's and the windowed one's
    address = (lambda pointer: ctypes.cast(pointer, ctypes.c_void_p).value)
    full, windowed = step.groups
    assert address(c_step.slots) == full.slots.data_ptr() and address(c_step.tables) == full.c_args[3].data_ptr()
    assert address(c_step.window_slots) == windowed.slots.data_ptr()
    assert address(c_step.window_tables) == windowed.c_args[3].data_ptr() and c_step.window_table_width == 3
    lone = llama_layer.llama_step(full.c_args[:3], B, [(full.slots, full.c_args[3], 0)])
    assert not lone.window_tables and lone.window_table_width == 0
