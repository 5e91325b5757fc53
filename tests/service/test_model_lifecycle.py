"""A model's life in the serving process (engine/frontend/lifecycle.py): an idle model unloads after
its keep-alive, its engine process exits and the memory goes back (by RSS), and the next request
loads it again and gets the same tokens; a request's keep_alive sets its own."""
import asyncio

import psutil

from contract import EngineConfig, SamplingParams
from engine import EngineProcess, ModelLifecycle, ModelState
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
