"""The Flow's start banner lists only the pages the gateway serves.

Jina's banner (`Flow._get_summary_table`, printed when the Flow is ready) lists Swagger UI
(/docs) and Redoc (/redoc) for every HTTP gateway, whatever it serves; this gateway serves them
only with LLM_HTTP_DEBUG=1 (gateway/edge/http_guard.py), so without it those links are 404s to
whoever follows them. Jina's `no_debug_endpoints` does not reach the banner, and a Flow file can
name no class of its own (Jina loads `jtype: Flow` alone), so the banner's method is replaced
here: Jina's panels, less that one unless the pages are served.

flows/llm.yml names this module in its `py_modules`, which Jina imports in the Flow's process
as it reads the file (that process prints the banner); the gateway's process, which serves the
pages, reads the same environment, so both decide alike. It imports only Jina and the gateway's
config, to keep the Flow's start quick.
"""
from typing import Any

from jina import Flow

from gateway.config import config

DEBUG_PANEL = "HTTP extension"  # the title of Jina's panel of the /docs and /redoc links

# Jina's own method, also where this module is imported a second time under another name
_jinas = getattr(Flow._get_summary_table, "__wrapped__", Flow._get_summary_table)


def summary_table(flow: Flow, all_panels: list[Any]) -> None:
    """Jina's panels, less the debug pages' unless LLM_HTTP_DEBUG serves them."""
    _jinas(flow, all_panels)
    if not config().http_debug:
        all_panels[:] = [p for p in all_panels if DEBUG_PANEL not in str(getattr(p, "title", ""))]


def install() -> None:
    setattr(summary_table, "__wrapped__", _jinas)  # noqa: B010 - a function's attribute, untyped
    Flow._get_summary_table = summary_table


install()
