"""The browser chat page (GET /chat-ui) and what it loads: its scripts, the pinned libraries it
renders markdown with (gateway/static/vendor, see its VERSIONS), and what its settings panel
offers: the generating models, and the request fields, read from the request contract so that
the page never names a default or a bound of its own. The bounds a server sets at run time (each
model's max_tokens_limit, the stop list's LLM_MAX_STOP_* limits) come from each model's ServerInfo,
so the page checks a setting as it is typed against the same numbers the server enforces.
Everything comes from this service: nothing is fetched from elsewhere, so the page works offline
and behind a firewall."""
from dataclasses import MISSING, Field
from importlib import resources
from typing import Any

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, JSONResponse, Response

from contract import ServerInfo, field_type, request_fields
from gateway.mapping.protocol import Upstream
from gateway.protocols.chat_files import ASSETS

# the request fields the settings panel shows, in this order: every one that shapes the sampling
SETTINGS = ("max_tokens", "temperature", "top_p", "top_k", "min_p", "typical_p", "repetition_penalty",
            "presence_penalty", "frequency_penalty", "seed", "stop", "reasoning_budget")
MEDIA = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}


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


def model_bounds(info: ServerInfo) -> dict[str, dict[str, int]]:
    """What one model's server allows beyond the declared bounds, as SamplingParams.validate and
    RequestLimits.check_stop check it: max_tokens from 1 (0 only scores a prompt, which a chat
    turn never asks) to its max_tokens_limit, and the stop list's length and each line's."""
    return {"max_tokens": {"ge": 1, "le": info.max_tokens_limit},
            "stop": {"max_items": info.max_stop_sequences, "max_chars": info.max_stop_chars}}


def page_router(backend: Upstream) -> APIRouter:
    router = APIRouter(tags=["Chat"])
    static = resources.files("gateway").joinpath("static")
    page = static.joinpath("chat.html").read_text(encoding="utf-8")
    assets = {name: static.joinpath(name).read_text(encoding="utf-8") for name in ASSETS}
    fields = settings()

    @router.get("/chat-ui", response_class=HTMLResponse, summary="A browser chat over /chat")
    async def chat_ui() -> HTMLResponse:
        return HTMLResponse(page)

    @router.get("/chat-ui/settings", summary="The models and request fields the chat page's settings offer, "
                                             "with each model's own bounds")
    async def chat_settings() -> JSONResponse:
        infos = await backend.models()
        return JSONResponse({"models": [info.model_id for info in infos], "fields": fields,
                             "bounds": {info.model_id: model_bounds(info) for info in infos}})

    for name, text in assets.items():
        suffix = name[name.rindex("."):]

        async def asset(text: str = text, suffix: str = suffix) -> Response:
            return Response(text, media_type=MEDIA[suffix], headers={"Cache-Control": "public, max-age=3600"})
        router.add_api_route(f"/chat-ui/{name}", asset, methods=["GET"], include_in_schema=False)
    return router
