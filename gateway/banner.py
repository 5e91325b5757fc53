"""The Flow's start banner lists only the pages the gateway serves.

Jina's banner (printed when the Flow is ready) lists Swagger UI (/docs) and Redoc (/redoc) for
every HTTP gateway, whatever it serves; this gateway serves them only with LLM_HTTP_DEBUG=1
(gateway/edge/http_guard.py), so without it those links are 404s to whoever follows them. The
banner keeps Jina's panels, less that one unless the pages are served (jina_patches'
filter_summary_table replaces Jina's method, which no setting reaches). It lists no public address:
Jina looked one up online as it printed the banner, and lost a Ctrl-C pressed meanwhile
(jina_patches' skip_public_address).

flows/llm.yml names this module in its `py_modules`, which Jina imports in the Flow's process
as it reads the file (that process prints the banner); the gateway's process, which serves the
pages, reads the same environment, so both decide alike. It imports only Jina (which the Flow's
process has loaded whole already) and the gateway's config, to keep the Flow's start quick.
"""
from typing import Any

from gateway.config import config
from gateway.edge import jina_patches

DEBUG_PANEL = "HTTP extension"  # the title of Jina's panel of the /docs and /redoc links


def shown(panel: Any) -> bool:
    """Whether the banner shows a panel of Jina's: the debug pages' only where LLM_HTTP_DEBUG serves them."""
    return config().http_debug or DEBUG_PANEL not in str(getattr(panel, "title", ""))


jina_patches.filter_summary_table(shown)
jina_patches.skip_public_address()
