"""A model's keep-alive timer (engine/frontend/lifecycle.py) with a stand-in engine: the timing
rules, in milliseconds. The real engine process's unload and reload are in
tests/service/test_model_lifecycle.py."""
import asyncio

from engine import ModelLifecycle, ModelState


class StandIn:
    """What the lifecycle uses of an engine: that it can be shut down."""

    def __init__(self) -> None:
        self.stopped = False

    def shutdown(self) -> None:
        self.stopped = True


async def until(model: ModelLifecycle, status: ModelState, timeout: float = 5.0) -> None:
    """Until the model is in `status` (tests/service's lifecycle tests wait with it too)."""
    for _ in range(int(timeout * 100)):
        if model.status is status:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"still {model.status}, not {status}")


async def test_a_model_loaded_at_start_and_never_asked_for_unloads_after_its_keep_alive():
    engine = StandIn()
    model = ModelLifecycle(lambda: engine, keep_alive_s=0.2)
    model.load_now()
    assert model.status is ModelState.LOADED and model.expires_at is not None
    await until(model, ModelState.UNLOADED)
    assert engine.stopped and (model.loads, model.unloads) == (1, 1)


async def test_a_request_at_start_holds_the_model_past_the_start_keep_alive():
    model = ModelLifecycle(StandIn, keep_alive_s=0.2)
    model.load_now()
    async with model.using(keep_alive=-1):
        await asyncio.sleep(0.4)
        assert model.status is ModelState.LOADED
    await asyncio.sleep(0.3)
    assert model.status is ModelState.LOADED and model.expires_at is None  # -1: for good


def test_outside_a_serving_loop_the_start_sets_no_timer():
    model = ModelLifecycle(StandIn, keep_alive_s=0.01)
    model.load_now()
    assert model.status is ModelState.LOADED and model.expires_at is None
