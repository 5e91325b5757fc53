"""The block pool, the rows' block tables with prefix caching, and the scheduler's admission,
chunking and preemption, tested directly (no model)."""
import pytest
import torch

from contract import EngineConfig, OverloadedError, SamplingParams, ValidationError
from engine.core.block_pool import BlockPool, chain_hashes
from engine.core.kv_manager import KVCacheManager
from engine.core.kv_pool import KVPool, KVShape
from engine.core.request import ParentRequest, Request, RequestState
from engine.core.scheduler import Scheduler

B = 4  # tokens per block in these tests


def request(rid: str, prompt: list[int] | int, max_tokens: int = 4) -> Request:
    ids = list(range(1, prompt + 1)) if isinstance(prompt, int) else prompt
    return Request(rid, ids, SamplingParams(max_tokens=max_tokens), None,
                   None, None, lambda out: None)  # type: ignore[arg-type]


def manager(blocks: int, caching: bool = True) -> KVCacheManager:
    pool = KVPool(KVShape(layers=2, kv_heads=1, head_dim=2, dtype=torch.float32, block_size=B), blocks,
                  torch.device("cpu"))
    return KVCacheManager(pool, caching)


def test_blocks_are_keyed_by_their_whole_prefix_and_the_least_recent_go_first():
    pool = BlockPool(6)  # 5 blocks and the null one
    keys = chain_hashes(list(range(12)), None, B)
    assert len(keys) == 3 and chain_hashes(list(range(4, 12)), keys[0], B) == keys[1:]
    held = pool.allocate(3)
    for block, key, start in zip(held, keys, (0, 4, 8), strict=True):
        pool.remember(block, key, list(range(start, start + 4)))
    assert pool.lookup(keys[1], [4, 5, 6, 7]) == held[1] and pool.lookup(keys[1], [4, 5, 6, 9]) is None
    pool.release(held)  # cached, free: the chain's tail is the least recent
    assert pool.num_free == 5 and pool.num_used == 0 and len(pool.cached) == 3
    partial = pool.allocate(1)
    pool.release(partial)  # no key: handed out before any cached block
    assert pool.allocate(2) == partial + [5] and len(pool.cached) == 3  # then blocks never used
    assert pool.allocate(1) == [held[2]] and len(pool.cached) == 2  # then the tail of the chain
    assert pool.allocate(5) is None  # not enough: nothing taken
    pool.acquire([held[0]])
    assert pool.refs[held[0]] == 1 and pool.num_free == 1


def test_a_row_starts_from_the_longest_cached_prefix_and_leaves_a_token_to_compute():
    kv = manager(blocks=10)
    first = request("a", 10)
    assert kv.cached_prefix(first) == [] and kv.start(first, [], 10) == []
    assert len(kv.table(first)) == 3 and kv.slots(first, 3, 3) == [kv.table(first)[0] * B + 3,
                                                                   kv.table(first)[1] * B, kv.table(first)[1] * B + 1]
    first.computed = 10
    kv.computed(first, 0)  # two full blocks keyed
    again = request("b", 10)
    prefix = kv.cached_prefix(again)
    assert prefix == kv.table(first)[:2]
    assert kv.start(again, prefix, 2) == [] and kv.table(again)[:2] == prefix
    assert kv.blocks.refs[prefix[0]] == 2
    exact = request("c", 8)  # a repeat of a whole cached prompt still computes its last token
    assert kv.cached_prefix(exact) == prefix[:1]
    kv.free(first)
    kv.free(again)
    assert kv.blocks.num_used == 0 and len(kv.blocks.cached) == 2


def test_an_answer_forks_the_prompts_blocks_and_copies_only_the_last():
    kv = manager(blocks=6)
    parent = request("p", 6)
    reserved = kv.start(parent, [], 6, reserve=1)  # the block the answer's copy goes into
    assert reserved is not None and len(reserved) == 1 and kv.blocks.num_used == 3
    parent.computed = 6
    kv.pool.keys[:, kv.table(parent)[1]] = 7.0
    kv.pool.values[:, kv.table(parent)[1]] = 8.0
    child = request("p#1", 6)
    kv.fork(parent, child, reserved[0])
    assert kv.table(child)[0] == kv.table(parent)[0] and kv.table(child)[1] == reserved[0]
    assert bool((kv.pool.keys[:, kv.table(child)[1]] == 7.0).all())
    assert bool((kv.pool.values[:, kv.table(child)[1]] == 8.0).all())
    assert kv.blocks.refs[kv.table(parent)[0]] == 2


def test_submit_refuses_what_never_fits_and_what_overflows_the_queue():
    sched = Scheduler(EngineConfig(model="x", max_waiting=1, max_running=2), manager(blocks=10))
    with pytest.raises(ValidationError) as err:
        sched.submit(request("big", 40, 20))  # 15 blocks of 10
    assert err.value.field == "max_tokens"
    with pytest.raises(ValidationError) as err:
        sched.submit(_rows(request("many", 8, 8), 3))  # 3 x 4 blocks
    assert err.value.field == "n"
    for rid in "abc":  # two start at the next step, on the free rows; one waits behind them
        sched.submit(request(rid, 1, 1))
    with pytest.raises(OverloadedError):
        sched.submit(request("d", 1, 1))
    assert sorted(r.request_id for r in sched.abort({"a", "b", "c"})) == ["a", "b", "c"] and not sched.has_work
    sched.submit(request("e", 1, 1))
    sched.submit(request("f", 1, 1))
    sched.schedule()  # both run: no row is free, and one may wait
    sched.submit(request("g", 1, 1))
    with pytest.raises(OverloadedError):
        sched.submit(request("h", 1, 1))


def _rows(req: Request, n: int) -> Request:
    req.parent = ParentRequest([request(f"{req.request_id}#{i}", req.prompt_ids, req.params.max_tokens)
                                for i in range(1, n)])
    return req


def test_a_step_decodes_every_row_and_chunks_prompts_within_the_budget():
    sched = Scheduler(EngineConfig(model="x", max_running=4, max_prefill_tokens=10), manager(blocks=40))
    for rid, length in (("a", 3), ("b", 25), ("c", 6)):
        sched.submit(request(rid, length))
    plan = sched.schedule()
    assert [(w.request.request_id, w.start, w.count, w.samples) for w in plan.work] == [
        ("a", 0, 3, True), ("b", 0, 7, False)]  # c waits: no budget left this step
    assert [r.request_id for r in plan.admitted] == ["a", "b"]
    for w in plan.work:
        w.request.computed += w.count
    sched.running[0].generated.append(99)  # a chose its first token
    plan = sched.schedule()
    assert [(w.request.request_id, w.start, w.count) for w in plan.work] == [("a", 3, 1), ("b", 7, 10)]


def test_rows_that_run_out_of_blocks_preempt_the_latest_admitted():
    kv = manager(blocks=4)
    sched = Scheduler(EngineConfig(model="x", max_running=4, max_prefill_tokens=64), kv)
    old, new = request("old", [1, 2, 3, 4], 8), request("new", [5, 6, 7, 8], 8)
    sched.submit(old)
    sched.submit(new)
    for w in sched.schedule().work:  # both prompts: two blocks of four
        w.request.computed += w.count
        w.request.generated.append(1)
    assert kv.blocks.num_free == 2
    sched.schedule()  # each grows into a second block: the pool is full
    for _ in range(4):  # four decode steps fill it
        for req in (old, new):
            req.computed += 1
            req.generated.append(1)
    plan = sched.schedule()  # old needs a third block: new gives its blocks back
    assert [w.request for w in plan.work] == [old] and new.state is RequestState.PREEMPTED
    assert new.computed == 0 and sched.num_waiting == 1 and sched.preemptions == 1
    sched.release(old)
    plan = sched.schedule()  # new starts again and recomputes its whole history
    assert [(w.request, w.start, w.count) for w in plan.work] == [(new, 0, len(new.history()))]
    assert plan.admitted == []  # it was admitted once already


def test_the_contracts_block_keys_are_transformers_own():
    """The router (gateway) and the engine key blocks with contract.blocks, written with the
    standard library: the same keys as transformers' compute_block_hash."""
    from transformers.generation.continuous_batching.cache_allocators.cache_allocator import compute_block_hash

    from contract.blocks import block_hash
    for parent in (None, 0, 2**64 - 1, 12345):
        for tokens in ([], [0], list(range(16)), [2**31 - 1, 7, 49151]):
            assert block_hash(parent, tokens) == compute_block_hash(parent, tokens)


def window_manager(blocks: int, window_blocks: int, window: int = 6) -> KVCacheManager:
    """Layer 0 keeps every key, layer 1 only its last `window` (its own pool of window_blocks)."""
    shape = KVShape(layers=2, kv_heads=1, head_dim=2, dtype=torch.float32, block_size=B, windows=(0, window))
    return KVCacheManager(KVPool(shape, blocks, torch.device("cpu"), window_blocks), caching=True)


def advance(kv: KVCacheManager, row: Request, tokens: int) -> None:
    """The row computes `tokens` more (answer tokens past its prompt), as a step would."""
    assert kv.grow(row, tokens)
    before = row.computed
    row.computed += tokens
    row.generated += [7] * max(0, row.computed - len(row.prompt_ids) - len(row.generated))
    kv.computed(row, before)


def test_a_window_layer_holds_only_the_blocks_its_window_reaches():
    kv = window_manager(blocks=20, window_blocks=4)  # a window of 6 keys reaches 3 blocks of 4 at most
    assert kv.pool.layer(0)[0].shape[0] == 21 and kv.pool.layer(1)[0].shape[0] == 5
    window = kv.groups[1]
    row = request("a", 10, max_tokens=60)
    assert kv.start(row, [], 10) == []
    assert sorted(window.readers) == sorted(kv.table(row))  # a prompt's first chunk reads all it writes
    advance(kv, row, 10)
    assert kv.group_tables(row)[1][0] == 0  # the next query (position 10) reads keys 5 to 10: blocks 1 and 2
    assert set(window.readers) == set(kv.table(row)[1:])
    while row.computed < 60:  # 15 table blocks; never more than 4 window blocks lent
        assert kv.grow(row, 1)
        slot = kv.slots(row, row.computed, 1)[0]
        assert kv.group_slots([slot])[1][0] // B == kv.group_tables(row)[1][row.computed // B]
        advance(kv, row, 1)
        assert len(window.readers) <= 3 and window.num_used <= 4
    table, window_table = kv.group_tables(row)
    assert len(table) == 15 and window_table[:13] == [0] * 13 and 0 not in window_table[13:]
    kv.free(row)
    assert not window.readers and kv.blocks.num_used == 0


def test_a_cached_prefix_is_used_as_far_as_its_window_layers_keys_remain():
    kv = window_manager(blocks=40, window_blocks=4)
    prompt = list(range(1, 25))  # 6 blocks, computed a block a step
    first = request("a", prompt)
    assert kv.start(first, [], 4) == []
    for _ in range(6):
        advance(kv, first, 4)
    kv.free(first)  # its last window's blocks stay lent, idle: the prefix cache can use them
    again = request("b", prompt)
    prefix = kv.cached_prefix(again)  # 5 blocks (a token left to compute); the window reads blocks 3 and 4
    window = kv.groups[1]
    assert len(prefix) == 5 and window.can_read(prefix[3:])
    other = request("c", list(range(100, 116)))  # four new blocks take every window block
    assert kv.start(other, [], 16) == []
    assert not window.can_read(prefix[3:]) and kv.blocks.lookup(kv.keys(again)[4], prompt[16:20]) == prefix[4]
    assert kv.cached_prefix(again) == []  # every window block is another row's: computed again
    assert kv.start(again, [], 4) is None  # not even its first block's window block is free
    kv.free(other)
    assert kv.start(again, kv.cached_prefix(again), 4) == []


def test_a_budget_in_bytes_counts_what_each_pool_keeps():
    """By bytes, the window pool takes what its rows need and the main pool the rest; by tokens,
    the main pool holds the tokens asked for. A shape without windows is sized as always."""
    plain = KVShape(layers=4, kv_heads=1, head_dim=8, dtype=torch.float16, block_size=B)  # 128 bytes a token
    assert plain.blocks_for(64, 128 * 100) == (25, 0) and plain.blocks_for(64) == (16, 0)
    shape = KVShape(layers=4, kv_heads=1, head_dim=8, dtype=torch.float16, block_size=B, windows=(0, 6, 6, 6))
    layer_block = 32 * B  # one layer's keys and values of a block: 128 bytes
    need = 2 * (2 + 2) + 2 + 1  # two rows' windows of 6 (2 blocks each, and 2 more), a step of 8 tokens, one more
    assert shape.blocks_for(64, 0, rows=2, step_tokens=8) == (16, need)
    main, window = shape.blocks_for(64, 100_000, rows=2, step_tokens=8)
    assert window == need and main == (100_000 - 3 * need * layer_block) // layer_block
    assert main * layer_block + window * 3 * layer_block <= 100_000 < (main + 1) * layer_block + window * 3 * layer_block
    assert shape.blocks_for(64, 2_000, rows=2, step_tokens=8) == (3, 3)  # under the window pool's need: both alike
    every = KVShape(layers=2, kv_heads=1, head_dim=8, dtype=torch.float16, block_size=B, windows=(6, 6))
    assert every.blocks_for(64, 100_000, rows=2, step_tokens=8) == (16, need)  # the main pool stores nothing
