"""Ollama's model routes: GET /api/version, /api/tags and /api/ps, POST /api/show, and /api/pull,
/api/delete and /api/copy, which succeed for a model this service serves and refuse any other (it
fetches nothing at run time). Editors and chat front ends (VS Code Copilot, Open WebUI, Obsidian)
find models only through these.

A model's Ollama name is its id with a tag, `:latest` unless the id has one; requests may name it
with or without the tag, as Ollama's own clients do. The served model is loaded for the server's
life, so /api/ps reports no expiry within any client's horizon.
"""
import hashlib
import json
from datetime import UTC, datetime
from typing import Any, Optional

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, StrictBool, StrictStr

from contract import ErrorKind, ServerInfo
from contract.transport import OLLAMA_STATUS
from gateway.inputs import BadRequest, parse_body
from gateway.protocol import Upstream

OLLAMA_VERSION = "0.13.0"  # the Ollama API release whose routes and fields these follow
NEVER = "9999-12-31T23:59:59Z"  # /api/ps's expires_at for a model kept loaded


def timestamp() -> str:
    """Now, as Ollama writes times (RFC 3339, UTC)."""
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


STARTED = timestamp()  # modified_at: when this gateway began


class NotServed(BadRequest):
    """A model name this service does not serve: 404, naming what it serves."""

    def __init__(self, message: str, param: str):
        super().__init__(message, param, ErrorKind.NOT_FOUND)


def error(message: str, kind: ErrorKind) -> Response:
    """Ollama's error shape: {"error": message}."""
    return JSONResponse({"error": message}, status_code=OLLAMA_STATUS[kind])


def ollama_name(info: ServerInfo) -> str:
    return info.model_id if ":" in info.model_id else f"{info.model_id}:latest"


def check_model(name: Optional[str], info: ServerInfo, field: str = "model") -> str:
    """The request's model name, when it names the served model (with or without its tag)."""
    if not name:
        raise BadRequest(f"{field}: required", field)
    if name not in (info.model_id, ollama_name(info)):
        raise NotServed(f"model '{name}' not found; this server serves '{ollama_name(info)}'", field)
    return name


def details(info: ServerInfo) -> dict[str, Any]:
    return {"parent_model": "", "format": "gguf" if info.dtype == "int4" else "safetensors",
            "family": info.architecture, "families": [info.architecture],
            "parameter_size": _size(info.parameters), "quantization_level": info.dtype.upper()}


def _size(parameters: int) -> str:
    """135M, 1.5B: Ollama's parameter_size."""
    return f"{parameters / 1e9:.1f}B" if parameters >= 1e9 else f"{round(parameters / 1e6)}M"


def digest(info: ServerInfo) -> str:
    """A stable digest of what is served (Ollama's is of the model's manifest)."""
    return hashlib.sha256(json.dumps([info.model_id, info.dtype, info.parameters]).encode()).hexdigest()


def listing(info: ServerInfo, running: bool) -> dict[str, Any]:
    """A model as /api/tags (running=False) or /api/ps lists it."""
    name = ollama_name(info)
    entry: dict[str, Any] = {"name": name, "model": name, "size": info.weight_bytes, "digest": digest(info),
                             "details": details(info)}
    if running:
        return {**entry, "expires_at": NEVER, "size_vram": info.weight_bytes if info.device.startswith("cuda") else 0,
                "context_length": info.max_context}
    return {**entry, "modified_at": STARTED}


def show(info: ServerInfo) -> dict[str, Any]:
    """POST /api/show: what a front end reads to offer a model (its context, whether it takes tools)."""
    arch = info.architecture
    return {"license": "", "modelfile": f"# served by llm-stream\nFROM {info.model_id}\n", "parameters": "",
            "template": info.chat_template_text, "details": details(info), "modified_at": STARTED,
            "model_info": {"general.architecture": arch, "general.basename": info.model_id,
                           "general.parameter_count": info.parameters,
                           f"{arch}.context_length": info.max_context},
            "capabilities": ["completion", *(["tools"] if info.chat_template else [])]}


class ModelRequest(BaseModel):
    """/api/show, /api/pull and /api/delete (`name` is the older spelling of `model`)."""
    model_config = ConfigDict(extra="forbid")
    model: Optional[StrictStr] = None
    name: Optional[StrictStr] = None
    verbose: Optional[StrictBool] = None  # show: the tokenizer's whole vocabulary, which is not listed here
    insecure: Optional[StrictBool] = None  # pull: no effect, nothing is fetched
    stream: Optional[StrictBool] = None  # pull: the status as NDJSON lines (the default) or one object

    def named(self, info: ServerInfo) -> str:
        return check_model(self.model or self.name, info)


class CopyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    source: StrictStr
    destination: StrictStr


async def _served(request: Request, backend: Upstream, not_served: str = "") -> ModelRequest | Response:
    """The request, when it names the served model; else the refusal (`not_served` added to a 404's message)."""
    try:
        req = await parse_body(request, ModelRequest)
        req.named(await backend.info())
    except BadRequest as exc:
        return error(str(exc) + (not_served if isinstance(exc, NotServed) else ""), exc.kind)
    return req


def ollama_models_router(backend: Upstream) -> APIRouter:
    router = APIRouter(prefix="/api", tags=["Ollama"])

    @router.get("/version", summary="Ollama: the API version these routes follow")
    async def version() -> dict:
        return {"version": OLLAMA_VERSION}

    @router.get("/tags", summary="Ollama: the models served")
    async def tags() -> dict:
        return {"models": [listing(await backend.info(), running=False)]}

    @router.get("/ps", summary="Ollama: the models loaded")
    async def ps() -> dict:
        return {"models": [listing(await backend.info(), running=True)]}

    @router.post("/show", summary="Ollama: a model's details, context length and capabilities")
    async def show_model(request: Request) -> Response:
        req = await _served(request, backend)
        return req if isinstance(req, Response) else JSONResponse(show(await backend.info()))

    @router.post("/pull", summary="Ollama: success for a model served here; nothing is fetched")
    async def pull(request: Request) -> Response:
        req = await _served(request, backend, "; this server fetches nothing at run time (serve a model with LLM_MODEL)")
        if isinstance(req, Response):
            return req
        if req.stream is False:
            return JSONResponse({"status": "success"})
        return Response(json.dumps({"status": "success"}) + "\n", media_type="application/x-ndjson")

    @router.delete("/delete", summary="Ollama: success for a model served here; nothing is deleted")
    async def delete(request: Request) -> Response:
        req = await _served(request, backend)
        return req if isinstance(req, Response) else Response(status_code=200)

    @router.post("/copy", summary="Ollama: success when both names are the model served here")
    async def copy(request: Request) -> Response:
        info = await backend.info()
        try:
            req = await parse_body(request, CopyRequest)
            check_model(req.source, info, "source")
            check_model(req.destination, info, "destination")
        except NotServed as exc:
            return error(f"{exc}; no new names are made at run time", ErrorKind.NOT_FOUND)
        except BadRequest as exc:
            return error(str(exc), exc.kind)
        return Response(status_code=200)

    return router
