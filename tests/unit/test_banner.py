"""The Flow's start banner (gateway/banner.py) lists Swagger UI and Redoc only where the gateway
serves them (LLM_HTTP_DEBUG=1; tests/service/test_hostile.py checks they are 404s without it).
The Flow is read from flows/llm.yml as `jina flow --uses` reads it, which imports the module."""
import io

import pytest

from gateway.config import config
from tests.conftest import ROOT


@pytest.fixture(scope="module")
def flow():
    from jina import Flow
    flow = Flow.load_config(str(ROOT / "flows" / "llm.yml"))
    flow._internal_ip = "10.0.0.2"
    return flow


def banner(flow, monkeypatch, debug: str) -> str:
    """The text of the panels the Flow prints when it is ready, with LLM_HTTP_DEBUG=`debug`."""
    from rich.console import Console

    monkeypatch.setenv("LLM_HTTP_DEBUG", debug)
    config.cache_clear()
    try:
        panels: list = []
        flow._get_summary_table(panels)
    finally:
        monkeypatch.delenv("LLM_HTTP_DEBUG")
        config.cache_clear()
    console = Console(file=io.StringIO(), width=200, record=True)
    console.print(*panels)
    return console.export_text()


@pytest.mark.parametrize("debug", ["", "0"])
def test_the_banner_lists_no_debug_page_that_is_not_served(flow, monkeypatch, debug):
    text = banner(flow, monkeypatch, debug)
    assert ":12346" in text  # the HTTP port is listed
    assert "/docs" not in text and "/redoc" not in text and "Swagger" not in text, text


def test_the_banner_lists_the_debug_pages_where_they_are_served(flow, monkeypatch):
    text = banner(flow, monkeypatch, "1")
    assert ":12346/docs" in text and ":12346/redoc" in text and "Swagger UI" in text, text


def test_the_banner_looks_up_no_public_address_online(monkeypatch):
    """Jina's lookup asked web services for the public address, and its bare `except:` swallowed a
    Ctrl-C pressed meanwhile (`jina flow` then waited forever): the banner lists no public address,
    and asks nothing to find one."""
    from jina import Flow
    from jina.orchestrate import orchestrator

    def online(*args, **kwargs):
        raise AssertionError("the banner looked up the public address online")

    monkeypatch.setattr(orchestrator, "get_public_ip", online)
    flow = Flow.load_config(str(ROOT / "flows" / "llm.yml"))
    flow._internal_ip = "10.0.0.2"
    panels: list = []
    flow._get_summary_table(panels)
    assert flow.address_public is None
    from rich.console import Console
    console = Console(file=io.StringIO(), width=200, record=True)
    console.print(*panels)
    text = console.export_text()
    assert "10.0.0.2:12346" in text and "Public" not in text, text
