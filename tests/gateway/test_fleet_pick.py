"""The router's pick (gateway/fleet/fleet.py) when no replica has reported yet, as for the first
request after a start: the replicas are asked for their reports at once, and the request goes on as
soon as one answers, with no sleep first (two sleeps of 0.1 s held the first request: its /info,
then its stream). One that never answers is asked again after each sleep, up to the wait."""
import asyncio

import pytest

from gateway.fleet import fleet as fleet_module
from gateway.fleet.fleet import Fleet
from gateway.fleet.replicas import Load, Replica
from gateway.fleet.router import NoReplica, Policy
from tests.conftest import on_a_new_loop


class Reporting(Replica):
    """A replica whose report comes back at once: reachable when `answers`."""

    def __init__(self, index: int, answers: bool):
        super().__init__(index, f"127.0.0.1:{50000 + index}", streamer=None)
        self.answers, self.asked = answers, 0

    async def report(self) -> None:
        self.asked += 1
        if self.answers:
            self.load, self.reachable = Load(at=1.0), True


class Members:
    def __init__(self, replicas: list[Replica]):
        self.replicas = replicas

    def initial(self) -> list[Replica]:
        return self.replicas

    async def refresh(self, replicas: list[Replica]) -> None:
        pass


def fleet(replicas: list[Replica], wait_s: float) -> Fleet:
    made = Fleet(Members(replicas), Policy.ROUND_ROBIN)  # type: ignore[arg-type]
    made.wait, made.poll = wait_s, 0.5
    return made


def first_pick(running: Fleet) -> Replica:
    """The fleet's first pick, on a loop of its own; its poller (started by the pick) stopped after."""
    async def pick() -> Replica:
        try:
            return await running.pick([], frozenset())
        finally:
            if running._poller is not None:
                running._poller.cancel()
    return on_a_new_loop(pick())


@pytest.fixture
def sleeps(monkeypatch) -> list[float]:
    """The seconds each of pick's sleeps asked for (each is taken, shortened to none)."""
    asked: list[float] = []
    real = asyncio.sleep

    async def sleep(seconds: float) -> None:
        asked.append(seconds)
        await real(0)
    monkeypatch.setattr(fleet_module.asyncio, "sleep", sleep)
    return asked


def test_the_first_pick_asks_for_reports_at_once_and_does_not_sleep(sleeps):
    replica = Reporting(0, answers=True)
    assert first_pick(fleet([replica], wait_s=15.0)) is replica
    assert replica.asked >= 1
    assert sleeps.count(0.1) == 0, sleeps


def test_a_replica_that_never_answers_is_asked_after_each_sleep_up_to_the_wait(sleeps):
    replica = Reporting(0, answers=False)
    with pytest.raises(NoReplica):
        first_pick(fleet([replica], wait_s=0.05))
    assert 0.1 in sleeps
    assert replica.asked >= 2
