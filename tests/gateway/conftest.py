"""The gateway tier's fixtures (fake_upstream.py), imported when a test asks for them: pytest loads
this file in every process of a run, the pytest-xdist controller too, which runs no test and should
not import docarray and torch for nothing."""
import pytest


@pytest.fixture
def fake():
    from tests.gateway.fake_upstream import FakeUpstream
    return FakeUpstream()


@pytest.fixture
def http(fake):
    from tests.gateway.fake_upstream import routes_app
    return routes_app(fake)
