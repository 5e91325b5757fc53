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
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Optional

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, StrictBool, StrictStr

from contract import ErrorKind, ServerInfo
from contract.transport import OLLAMA_STATUS
from gateway.mapping.api_fields import ApiFields, no_effect, served
from gateway.mapping.inputs import BadRequest, parse_body
from gateway.mapping.protocol import Upstream, embedding_state

OLLAMA_VERSION = "0.13.0"  # the Ollama API release whose routes and fields these follow
NEVER = "9999-12-31T23:59:59Z"  # /api/ps's expires_at for a model kept loaded


def _iso(unix: float) -> str:
    return datetime.fromtimestamp(unix, UTC).isoformat().replace("+00:00", "Z")


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


@dataclass(frozen=True)
class OllamaModel:
    """A served model as Ollama's routes describe it: the generating one, or the embedding one."""

    model_id: str
    architecture: str
    parameters: int
    size: int  # bytes of its weights in memory
    quantization: str
    context_length: int
    capabilities: tuple[str, ...]
    template: str = ""
    on_gpu: bool = False
    extra_info: tuple[tuple[str, int], ...] = ()  # model_info's own keys (an embedding's length)
    loaded: bool = True
    expires_at: Optional[float] = None  # when it unloads, idle (Unix time); None: not due to
    load_seconds: Optional[float] = None  # what its last load took (None: none, as the embedder's)

    @classmethod
    def generating(cls, info: ServerInfo) -> "OllamaModel":
        return cls(info.model_id, info.architecture, info.parameters, info.weight_bytes, info.dtype,
                   info.max_context, ("completion", *(["tools"] if info.chat_template else [])),
                   info.chat_template_text, info.device.startswith("cuda"), loaded=info.state != "unloaded",
                   expires_at=info.expires_at, load_seconds=info.load_seconds)

    @classmethod
    def embedding(cls, info: dict[str, Any]) -> "OllamaModel":
        """From the embedder's EmbedderInfo (engine/embedder_info.py): loaded once it has embedded."""
        loaded = embedding_state(info) == "loaded"
        return cls(info["model_id"], info["architecture"], info["parameters"], info["parameters"] * 4, "float32",
                   info["max_tokens"], ("embedding",), extra_info=(("embedding_length", info["dimensions"]),),
                   loaded=loaded, load_seconds=info.get("load_seconds") if loaded else None)

    @property
    def name(self) -> str:
        """Ollama's name: the id with a tag, `:latest` unless it has one."""
        return self.model_id if ":" in self.model_id else f"{self.model_id}:latest"

    def named(self, name: Optional[str]) -> bool:
        return name in (self.model_id, self.name)

    def details(self) -> dict[str, Any]:
        return {"parent_model": "", "format": "gguf" if self.quantization == "int4" else "safetensors",
                "family": self.architecture, "families": [self.architecture],
                "parameter_size": _size(self.parameters), "quantization_level": self.quantization.upper()}

    def listing(self, running: bool) -> dict[str, Any]:
        """As /api/tags (running=False) or /api/ps lists it."""
        digest = hashlib.sha256(json.dumps([self.model_id, self.quantization, self.parameters]).encode()).hexdigest()
        entry: dict[str, Any] = {"name": self.name, "model": self.name, "size": self.size, "digest": digest,
                                 "details": self.details()}
        if running:
            expires = NEVER if self.expires_at is None else _iso(self.expires_at)
            return {**entry, "expires_at": expires, "size_vram": self.size if self.on_gpu else 0,
                    "context_length": self.context_length,
                    "load_duration": round((self.load_seconds or 0.0) * 1e9)}  # ns, as Ollama's load_duration
        return {**entry, "modified_at": STARTED}

    def show(self) -> dict[str, Any]:
        """POST /api/show: what a front end reads to offer a model (its context, whether it takes tools)."""
        arch = self.architecture
        return {"license": "", "modelfile": f"# served by llm-stream\nFROM {self.model_id}\n", "parameters": "",
                "template": self.template, "details": self.details(), "modified_at": STARTED,
                "model_info": {"general.architecture": arch, "general.basename": self.model_id,
                               "general.parameter_count": self.parameters,
                               f"{arch}.context_length": self.context_length,
                               **{f"{arch}.{key}": value for key, value in self.extra_info}},
                "capabilities": list(self.capabilities)}


async def served_models(backend: Upstream, live: bool = False) -> list[OllamaModel]:
    """The generating models, then the embedding model when one is served (`live`: with their
    states now, loaded or not)."""
    embedding = await backend.embed_info(live)
    return [*(OllamaModel.generating(info) for info in await backend.models(live)),
            *([OllamaModel.embedding(embedding)] if embedding else [])]


def find_model(name: Optional[str], models: list[OllamaModel], field: str = "model") -> OllamaModel:
    """The served model that `name` names (with or without its tag); else a refusal naming `field`."""
    if not name:
        raise BadRequest(f"{field}: required", field)
    for model in models:
        if model.named(name):
            return model
    names = "', '".join(m.name for m in models)
    raise NotServed(f"model '{name}' not found; this server serves '{names}'", field)


def generating_model(name: Optional[str], models: list[ServerInfo], field: str = "model") -> ServerInfo:
    """The generating model that `name` names (with or without its tag); else a refusal naming `field`."""
    found = find_model(name, [OllamaModel.generating(info) for info in models], field)
    return next(info for info in models if info.model_id == found.model_id)


def _size(parameters: int) -> str:
    """135M, 1.5B: Ollama's parameter_size."""
    return f"{parameters / 1e9:.1f}B" if parameters >= 1e9 else f"{round(parameters / 1e6)}M"


MODEL_FIELDS = ApiFields("Ollama's /api/show, /api/pull and /api/delete", (
    *served("model", "name", "stream"), *no_effect("verbose", "insecure")))
COPY_FIELDS = ApiFields("Ollama's /api/copy", served("source", "destination"))


class ModelRequest(BaseModel):
    """/api/show, /api/pull and /api/delete (`name` is the older spelling of `model`); the rest arrive
    as extras, which MODEL_FIELDS refuses."""
    model_config = ConfigDict(extra="allow")
    model: Optional[StrictStr] = None
    name: Optional[StrictStr] = None
    verbose: Optional[StrictBool] = None  # show: the tokenizer's whole vocabulary, which is not listed here
    insecure: Optional[StrictBool] = None  # pull: no effect, nothing is fetched
    stream: Optional[StrictBool] = None  # pull: the status as NDJSON lines (the default) or one object

    def served(self, models: list[OllamaModel]) -> OllamaModel:
        """The served model this request names (with or without its tag)."""
        return find_model(self.model or self.name, models)


class CopyRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # the rest arrive as extras: COPY_FIELDS refuses them
    source: StrictStr
    destination: StrictStr


async def _served(request: Request, backend: Upstream,
                  not_served: str = "") -> tuple[ModelRequest, OllamaModel] | Response:
    """The request and the served model it names; else the refusal (`not_served` added to a 404's)."""
    try:
        req = await parse_body(request, ModelRequest)
        MODEL_FIELDS.check(req)
        return req, req.served(await served_models(backend))
    except BadRequest as exc:
        return error(str(exc) + (not_served if isinstance(exc, NotServed) else ""), exc.kind)


def ollama_models_router(backend: Upstream) -> APIRouter:
    router = APIRouter(prefix="/api", tags=["Ollama"])

    @router.get("/version", summary="Ollama: the API version these routes follow")
    async def version() -> dict:
        return {"version": OLLAMA_VERSION}

    @router.get("/tags", summary="Ollama: the models served")
    async def tags() -> dict:
        return {"models": [m.listing(running=False) for m in await served_models(backend)]}

    @router.get("/ps", summary="Ollama: the models loaded")
    async def ps() -> dict:
        return {"models": [m.listing(running=True) for m in await served_models(backend, live=True) if m.loaded]}

    @router.post("/show", summary="Ollama: a model's details, context length and capabilities")
    async def show_model(request: Request) -> Response:
        found = await _served(request, backend)
        return found if isinstance(found, Response) else JSONResponse(found[1].show())

    @router.post("/pull", summary="Ollama: success for a model served here; nothing is fetched")
    async def pull(request: Request) -> Response:
        found = await _served(request, backend, "; this server fetches nothing at run time (serve a model with "
                                                "LLM_MODEL)")
        if isinstance(found, Response):
            return found
        if found[0].stream is False:
            return JSONResponse({"status": "success"})
        return Response(json.dumps({"status": "success"}) + "\n", media_type="application/x-ndjson")

    @router.delete("/delete", summary="Ollama: success for a model served here; nothing is deleted")
    async def delete(request: Request) -> Response:
        found = await _served(request, backend)
        return found if isinstance(found, Response) else Response(status_code=200)

    @router.post("/copy", summary="Ollama: success when both names are one model served here")
    async def copy(request: Request) -> Response:
        try:
            req = await parse_body(request, CopyRequest)
            COPY_FIELDS.check(req)
            models = await served_models(backend)
            source = find_model(req.source, models, "source")
            if not source.named(req.destination):
                raise NotServed(f"destination: '{req.destination}' is not a name of '{source.name}'; no new names "
                                "are made at run time", "destination")
        except BadRequest as exc:
            return error(str(exc), exc.kind)
        return Response(status_code=200)

    return router
