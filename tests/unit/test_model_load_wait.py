"""Requests that wait for a model's load (engine/frontend/lifecycle.py), with a stand-in engine whose
load takes a moment: they share one load, one that goes away leaves it to finish, a failed load
fails them all naming the model, the service's stop leaves no engine behind, each wait is told,
and the spare is started at an unload and closed at the stop. The real engine process's are in
tests/service/test_model_lifecycle.py."""
import asyncio
import threading
import time

import pytest

from contract import EngineDeadError
from engine import ModelLifecycle, ModelState

LOAD_S = 0.3


class SlowStart:
    """A start that takes LOAD_S on the loading thread, counted; `fail` makes it raise."""

    def __init__(self, fail: str = "") -> None:
        self.fail, self.started, self.engines = fail, 0, []

    def __call__(self) -> "Engine":
        self.started += 1
        time.sleep(LOAD_S)
        if self.fail:
            raise RuntimeError(self.fail)
        self.engines.append(Engine())
        return self.engines[-1]


class Engine:
    def __init__(self) -> None:
        self.stopped = False

    def shutdown(self) -> None:
        self.stopped = True


class Spare:
    """What the lifecycle uses of a SpareCore."""

    def __init__(self) -> None:
        self.filled = self.closed = 0
        self.thread = ""

    def fill(self) -> None:
        self.filled += 1
        self.thread = threading.current_thread().name

    def close(self) -> None:
        self.closed += 1


async def test_requests_share_one_load_and_one_that_leaves_does_not_lose_it():
    start, waits = SlowStart(), []
    model = ModelLifecycle(start, keep_alive_s=60, on_wait=waits.append)

    async def request() -> Engine:
        async with model.using() as engine:
            return engine

    leaving = asyncio.ensure_future(request())
    await asyncio.sleep(LOAD_S / 3)
    leaving.cancel()  # its client went away while the model loaded
    staying = await asyncio.gather(request(), request())
    assert leaving.cancelled() and start.started == 1 and model.loads == 1
    assert staying[0] is staying[1] is start.engines[0] is model.engine and model.status is ModelState.LOADED
    assert len(waits) == 2 and all(0 < w < 10 for w in waits)
    await request()  # loaded: no wait to tell
    assert len(waits) == 2
    model.shutdown()


async def test_a_failed_load_fails_every_request_that_waited_naming_the_model_and_the_next_tries_again():
    start = SlowStart(fail="no weights in /nowhere")
    model = ModelLifecycle(start, keep_alive_s=60, name="my-model")

    async def request() -> None:
        async with model.using():
            pass

    outcomes = await asyncio.gather(request(), request(), return_exceptions=True)
    assert all(isinstance(o, EngineDeadError) for o in outcomes), outcomes
    assert all("my-model" in str(o) and "no weights in /nowhere" in str(o) for o in outcomes)
    assert str(outcomes[0]).startswith("model: ") and start.started == 1
    assert model.status is ModelState.UNLOADED
    start.fail = ""
    await request()  # the next one loads it
    assert start.started == 2 and model.status is ModelState.LOADED
    model.shutdown()


async def test_the_service_stopping_while_a_model_loads_leaves_no_engine_behind():
    start = SlowStart()
    model = ModelLifecycle(start, keep_alive_s=60)

    async def request() -> None:
        async with model.using():
            pass

    waiting = asyncio.ensure_future(request())
    await asyncio.sleep(LOAD_S / 3)
    model.shutdown()
    with pytest.raises(EngineDeadError, match="stopping"):
        await waiting
    assert start.engines[0].stopped and model.engine is None


async def test_an_unload_starts_the_spare_off_the_loop_and_the_stop_closes_it():
    spare = Spare()
    model = ModelLifecycle(lambda: Engine(), keep_alive_s=60, spare=spare)  # type: ignore[arg-type]
    model.load_now()
    async with model.using(keep_alive=0):
        pass
    for _ in range(200):
        if model.status is ModelState.UNLOADED:
            break
        await asyncio.sleep(0.01)
    assert model.status is ModelState.UNLOADED and spare.filled == 1
    assert spare.thread != threading.current_thread().name  # Popen runs on a thread, not on the loop
    model.shutdown()
    assert spare.closed == 1


async def test_a_lease_says_how_long_its_request_waited_for_the_load():
    """What Ollama's load_duration reports: the wait of a request that came while its model was
    unloaded; none for one that found it loaded."""
    model = ModelLifecycle(SlowStart(), keep_alive_s=60)
    async with model.lease() as first:
        assert first.engine is model.engine and first.load_wait_s is not None and first.load_wait_s >= LOAD_S * 0.9
    async with model.lease() as second:
        assert second.engine is model.engine and second.load_wait_s is None
    model.shutdown()
