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
    flow._internal_ip, flow._public_ip = "10.0.0.2", "203.0.113.2"  # Jina would look the public one up online
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
