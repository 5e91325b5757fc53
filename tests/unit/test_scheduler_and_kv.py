"""The scheduler's admission and release, and the KV batch's rows, tested directly."""
import pytest

from contract import EngineConfig, OverloadedError, SamplingParams, ValidationError
from executors.engine.kv_batch import KVBatch, new_cache, prefill_group
from executors.engine.request import Request, RequestState
from executors.engine.scheduler import Scheduler


def request(rid: str, prompt: int, max_tokens: int) -> Request:
    return Request(rid, list(range(1, prompt + 1)), SamplingParams(max_tokens=max_tokens), None,
                   None, None, None, lambda out: None)  # type: ignore[arg-type]


def test_admission_stops_at_max_running_then_at_the_padded_budget():
    sched = Scheduler(EngineConfig(model="x", max_running=2, max_waiting=8, max_batch_tokens=100))
    for i in range(3):
        sched.submit(request(f"r{i}", 10, 10))
    assert [r.request_id for r in sched.admit()] == ["r0", "r1"] and sched.num_waiting == 1
    assert sched.reserved == 40 and all(r.state is RequestState.PREFILLING for r in sched.prefilling)
    sched.release(sched.prefilling[0])
    assert sched.reserved == 20
    assert [r.request_id for r in sched.admit()] == ["r2"]

    budget = Scheduler(EngineConfig(model="x", max_running=8, max_batch_tokens=100))
    budget.submit(request("long", 40, 10))  # 50 tokens
    budget.submit(request("short", 2, 2))  # padded to the longest: 2 rows x 50
    budget.submit(request("third", 2, 2))  # 3 x 50 > 100: waits
    assert [r.request_id for r in budget.admit()] == ["long", "short"] and budget.num_waiting == 1


def test_release_frees_every_trace_of_a_running_request():
    sched = Scheduler(EngineConfig(model="x", max_batch_tokens=1000))
    req = request("r", 5, 5)
    sched.submit(req)
    sched.admit()
    sched.start_running(req)
    assert sched.running == {"r": req} and not sched.prefilling
    sched.release(req)
    assert not sched.has_work and sched.reserved == 0 and req.state is RequestState.FINISHED


def test_submit_refuses_what_never_fits_and_what_overflows_the_queue():
    sched = Scheduler(EngineConfig(model="x", max_waiting=1, max_batch_tokens=50))
    with pytest.raises(ValidationError) as err:
        sched.submit(request("big", 40, 20))
    assert err.value.field == "max_tokens"
    sched.submit(request("a", 1, 1))
    with pytest.raises(OverloadedError):
        sched.submit(request("b", 1, 1))
    assert sched.remove_waiting("a") is not None and not sched.has_work


@pytest.fixture(scope="module")
def tiny(gpt2_model):
    from contract import EngineConfig as Config
    from executors.engine.loader import load_model
    return load_model(Config(model=gpt2_model))


def test_rows_join_leave_and_decode_as_they_would_alone(tiny):
    model, device = tiny.model, tiny.device
    prompts = {"a": [5, 6, 7, 8, 9], "b": [10, 11], "c": [12, 13, 14]}

    def alone(ids: list[int], steps: int) -> list[int]:
        batch = KVBatch(model, device)
        cache = new_cache()
        logits, mask = prefill_group(model, cache, [ids], device)
        tokens = [int(logits.argmax(-1))]
        batch.add(["x"], cache, mask, tokens)
        for _ in range(steps):
            tokens.append(int(batch.decode_step().argmax(-1)))
            batch.set_next_tokens(tokens[-1:])
        return tokens

    batch = KVBatch(model, device)
    got: dict[str, list[int]] = {}
    for rid in ("a", "b"):  # joined one after the other: padded to each other's width
        cache = new_cache()
        logits, mask = prefill_group(model, cache, [prompts[rid]], device)
        got[rid] = [int(logits.argmax(-1))]
        batch.add([rid], cache, mask, got[rid][-1:])
    for step in range(4):
        if step == 2:
            batch.keep(["b"])  # a leaves; its columns go, and c joins
            cache = new_cache()
            logits, mask = prefill_group(model, cache, [prompts["c"]], device)
            got["c"] = [int(logits.argmax(-1))]
            batch.add(["c"], cache, mask, got["c"][-1:])
        logits = batch.decode_step()
        for row, rid in enumerate(batch.rows):
            got[rid].append(int(logits[row].argmax()))
        batch.set_next_tokens([got[r][-1] for r in batch.rows])
        assert batch.consistent()
    assert got["a"] == alone(prompts["a"], 2)
    assert got["b"] == alone(prompts["b"], 4)
    assert got["c"] == alone(prompts["c"], 2)
    batch.keep([])
    assert len(batch) == 0 and batch.cache is None
