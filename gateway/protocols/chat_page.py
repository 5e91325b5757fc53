"""The browser chat page (GET /chat-ui) and what it loads: its script, the pinned libraries it
renders markdown with (gateway/static/vendor, see its VERSIONS), and what its settings panel
offers: the generating models, and the request fields, read from the request contract so that
the page never names a default or a bound of its own. Everything comes from this service:
nothing is fetched from elsewhere, so the page works offline and behind a firewall."""
from dataclasses import MISSING, Field
from importlib import resources
from typing import Any

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, JSONResponse, Response

from contract import field_type, request_fields
from gateway.mapping.protocol import Upstream

# the request fields the settings panel shows, in this order: every one that shapes the sampling
SETTINGS = ("max_tokens", "temperature", "top_p", "top_k", "min_p", "typical_p", "repetition_penalty",
            "presence_penalty", "frequency_penalty", "seed", "stop", "reasoning_budget")
MEDIA = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}
ASSETS = ("chat.js", "vendor/marked.umd.js", "vendor/purify.min.js", "vendor/highlight.min.js",
          "vendor/github.min.css", "vendor/github-dark.min.css")


def settings() -> list[dict[str, Any]]:
    """Each field the panel shows, in SETTINGS' order: its name, type, default, bounds and help,
    as declared."""
    declared = {f.name: f for f in request_fields()}
    return [_described(declared[name]) for name in SETTINGS]


def _described(f: Field) -> dict[str, Any]:
    kind, nullable = field_type(f)
    bounds = {k: f.metadata[k] for k in ("ge", "gt", "le", "lt") if k in f.metadata}
    default = [] if f.default is MISSING else f.default
    return {"name": f.name, "type": kind.__name__, "nullable": nullable, "default": default,
            "help": f.metadata["help"], **bounds}


def page_router(backend: Upstream) -> APIRouter:
    router = APIRouter(tags=["Chat"])
    static = resources.files("gateway").joinpath("static")
    page = static.joinpath("chat.html").read_text(encoding="utf-8")
    assets = {name: static.joinpath(name).read_text(encoding="utf-8") for name in ASSETS}
    fields = settings()

    @router.get("/chat-ui", response_class=HTMLResponse, summary="A browser chat over /chat")
    async def chat_ui() -> HTMLResponse:
        return HTMLResponse(page)

    @router.get("/chat-ui/settings", summary="The models and request fields the chat page's settings offer")
    async def chat_settings() -> JSONResponse:
        models = [info.model_id for info in await backend.models()]
        return JSONResponse({"models": models, "fields": fields})

    for name, text in assets.items():
        suffix = name[name.rindex("."):]

        async def asset(text: str = text, suffix: str = suffix) -> Response:
            return Response(text, media_type=MEDIA[suffix], headers={"Cache-Control": "public, max-age=3600"})
        router.add_api_route(f"/chat-ui/{name}", asset, methods=["GET"], include_in_schema=False)
    return router
