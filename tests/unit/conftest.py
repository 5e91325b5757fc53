"""The unit tier's engines: AsyncEngine on tiny models, shut down after each test."""
import pytest

from contract import EngineConfig
from engine import AsyncEngine


@pytest.fixture
async def make_engine():
    made = []

    def factory(model: str, **kw) -> AsyncEngine:
        made.append(AsyncEngine(EngineConfig(model=model, **kw)))
        return made[-1]
    yield factory
    for engine in made:
        engine.shutdown()
