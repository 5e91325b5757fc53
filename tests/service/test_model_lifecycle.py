"""A model's life in the serving process (engine/frontend/lifecycle.py): an idle model unloads after
its keep-alive, its engine process exits and the memory goes back (by RSS), and the next request
loads it again and gets the same tokens; a request's keep_alive sets its own. After an unload a
spare engine process waits, its imports done, and the next load takes it; nothing outlives the
stop; a load that fails names the model. The Flow's side (its metric, /api/ps, /stats, the log)
is in tests/service/test_model_load_flow.py."""
import asyncio
import shutil
import time
from contextlib import aclosing

import psutil
import pytest

from contract import EngineConfig, EngineDeadError, SamplingParams
from engine import EngineProcess, ModelLifecycle, ModelState, SpareCore
from engine.frontend.engine_process import STAGES
from tests.unit.test_model_lifecycle import until

GREEDY = SamplingParams(max_tokens=12, ignore_eos=True)


def _tree_rss() -> int:
    """This process's resident memory and its children's, in bytes."""
    me = psutil.Process()
    return sum(p.memory_info().rss for p in [me, *me.children(recursive=True)] if p.is_running())


async def _answer(model: ModelLifecycle, keep_alive=None) -> str:
    async with model.using(keep_alive) as engine:
        return "".join(out.text for out in await engine.complete("hello world", GREEDY))


async def test_an_idle_model_unloads_its_memory_and_the_next_request_loads_it_again(gpt2_model):
    model = ModelLifecycle(lambda: EngineProcess(EngineConfig(model=gpt2_model)), keep_alive_s=1.0)
    try:
        engine = model.load_now()
        pid = engine.pid
        first = await _answer(model)
        loaded_rss, engine_rss = _tree_rss(), psutil.Process(pid).memory_info().rss
        assert model.expires_at is not None  # idle, and due to unload
        await until(model, ModelState.UNLOADED, timeout=30)
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        assert _tree_rss() < loaded_rss - engine_rss // 2, (loaded_rss, engine_rss, _tree_rss())
        assert await _answer(model) == first  # loaded again for it, the same tokens
        assert (model.loads, model.unloads) == (2, 1)
    finally:
        model.shutdown()


async def test_a_requests_keep_alive_sets_how_long_its_model_stays(gpt2_model):
    model = ModelLifecycle(lambda: EngineProcess(EngineConfig(model=gpt2_model)), keep_alive_s=0.5)
    try:
        model.load_now()
        await _answer(model, keep_alive=-1)  # for good
        await asyncio.sleep(1.5)
        assert model.status is ModelState.LOADED and model.expires_at is None
        await _answer(model, keep_alive=0)  # unloads as soon as it ends
        await until(model, ModelState.UNLOADED, timeout=15)
        answers = await asyncio.gather(*(_answer(model, keep_alive=60) for _ in range(3)))  # wait for one load
        assert len(set(answers)) == 1 and model.loads == 2 and model.status is ModelState.LOADED
        assert model.expires_at is not None and model.expires_at > 0
    finally:
        model.shutdown()


# ----- the spare: an engine process started at the unload, its imports done before the next load -----

def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _memory(pid: int) -> str:
    mem = psutil.Process(pid).memory_full_info()
    return f"RSS {mem.rss / 2**20:.0f} MiB, PSS {mem.pss / 2**20:.0f} MiB, USS {mem.uss / 2**20:.0f} MiB"


async def _first_token_s(model: ModelLifecycle) -> tuple[float, EngineProcess]:
    """Seconds from the request to its first token (the load included), and the engine that gave it."""
    started = time.monotonic()
    async with model.using() as engine:
        async with aclosing(await engine.open("hello world", GREEDY)) as stream:
            async for _ in stream:
                return time.monotonic() - started, engine  # type: ignore[return-value]
    raise AssertionError("no token")


async def test_after_an_unload_the_next_load_takes_the_spare_and_no_process_is_left(gpt2_model):
    spare = SpareCore()
    model = ModelLifecycle(lambda: EngineProcess(EngineConfig(model=gpt2_model), spare=spare), keep_alive_s=60,
                           name="gpt2", spare=spare)
    pids = []
    try:
        engine = model.load_now()
        pids.append(engine.pid)
        assert spare.pid is None and engine.start_stages["spare"] == 0.0  # none while the model is loaded
        first = await _answer(model, keep_alive=0)
        await until(model, ModelState.UNLOADED, timeout=30)
        spare_pid = spare.pid
        assert spare_pid is not None and _alive(spare_pid) and not _alive(pids[0])
        pids.append(spare_pid)
        await asyncio.sleep(8)  # its imports done (seconds on a busy 2-core machine)
        print(f"\nthe spare waiting for its config: {_memory(spare_pid)}")
        seconds, engine = await _first_token_s(model)
        stages = engine.start_stages
        print(f"first token {seconds:.2f} s after the request; the load's stages: "
              + ", ".join(f"{k} {v:.2f}" for k, v in stages.items()))
        assert engine.pid == spare_pid and stages["spare"] == 1.0 and (spare.started, spare.taken) == (1, 1)
        assert set(STAGES) | {"total", "imports_done"} <= set(stages) and all(v >= 0 for v in stages.values())
        assert abs(sum(stages[s] for s in STAGES) - stages["total"]) < 0.01
        assert model.load_seconds is not None and model.load_seconds >= stages["total"]
        assert spare.pid is None  # taken: the next unload starts another
        assert await _answer(model) == first  # the same tokens as the process started for the model
    finally:
        model.shutdown()
    assert [pid for pid in pids if _alive(pid)] == []


async def test_the_stop_while_the_spare_imports_leaves_no_process(gpt2_model):
    spare = SpareCore()
    model = ModelLifecycle(lambda: EngineProcess(EngineConfig(model=gpt2_model), spare=spare), keep_alive_s=60,
                           spare=spare)
    model.load_now()
    await _answer(model, keep_alive=0)
    await until(model, ModelState.UNLOADED, timeout=30)
    spare_pid = spare.pid
    assert spare_pid is not None and _alive(spare_pid)
    model.shutdown()  # at once, its imports under way
    assert not _alive(spare_pid) and spare.pid is None
    spare.fill()  # an unload that ends after the stop starts none
    assert spare.pid is None


async def test_a_load_that_fails_names_the_model_and_the_next_request_loads_it(gpt2_model, tmp_path):
    """The model's folder gone while it is unloaded: the request that needed it fails naming the
    model (the spare's process it took is gone too); back, the next request loads it."""
    folder = tmp_path / "gpt2"
    shutil.copytree(gpt2_model, folder)
    spare = SpareCore()
    model = ModelLifecycle(lambda: EngineProcess(EngineConfig(model=str(folder)), spare=spare), keep_alive_s=60,
                           name="gpt2", spare=spare)
    try:
        model.load_now()
        first = await _answer(model, keep_alive=0)
        await until(model, ModelState.UNLOADED, timeout=30)
        spare_pid = spare.pid
        folder.rename(tmp_path / "away")
        with pytest.raises(EngineDeadError) as failed:
            await _answer(model)
        assert str(failed.value).startswith("model: could not load gpt2: ") and str(folder) in str(failed.value)
        assert spare_pid is not None and not _alive(spare_pid) and model.status is ModelState.UNLOADED
        (tmp_path / "away").rename(folder)
        assert await _answer(model) == first and model.loads == 2
    finally:
        model.shutdown()
