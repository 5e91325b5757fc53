"""Embeddings on the HTTP port: OpenAI's POST /v1/embeddings, Ollama's POST /api/embed and its
older POST /api/embeddings. Each request's inputs go to the embedding executor as one DocList of
EmbeddingDocuments, and its vectors come back in the inputs' order.

OpenAI: `input` is a string, a list of strings, a list of token ids or a list of such lists (the
embedding model's own ids); `encoding_format` is float or base64 (little-endian float32, which the
openai SDK asks for by default); `dimensions` is refused unless it is the model's. An input longer
than the model takes is refused, as OpenAI does. Ollama cuts it there unless `truncate` is false.
A model name other than the embedding model's gets 404, in each API's error shape.
"""
import base64
import time
from typing import Any, Optional, Union

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, StrictBool, StrictInt, StrictStr

from contract.transport import OPENAI_STATUS, error_kind
from gateway.mapping.api_fields import ApiFields, no_effect, served
from gateway.mapping.inputs import BadRequest, parse_body
from gateway.mapping.protocol import Upstream
from gateway.protocols.ollama_models import NotServed, error
from gateway.protocols.openai_routes import error_body
from schemas import EmbeddingDocument

MAX_INPUTS = 2048  # OpenAI's bound on a request's inputs
OPENAI_FIELDS = ApiFields("OpenAI's embeddings", (
    *served("model", "input", "encoding_format", "dimensions"), *no_effect("user")))
OLLAMA_FIELDS = ApiFields("Ollama's /api/embed", (
    *served("model", "input", "truncate", "dimensions", "options"), *no_effect("keep_alive")))
OLLAMA_OLD_FIELDS = ApiFields("Ollama's /api/embeddings", (
    *served("model", "prompt", "options"), *no_effect("keep_alive")))
Inputs = Union[StrictStr, list[StrictStr], list[StrictInt], list[list[StrictInt]]]


class OpenAIEmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: Optional[StrictStr] = None
    input: Inputs
    encoding_format: Optional[StrictStr] = None
    dimensions: Optional[StrictInt] = None
    user: Optional[StrictStr] = None


class OllamaEmbedRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: Optional[StrictStr] = None
    input: Union[StrictStr, list[StrictStr]]
    truncate: Optional[StrictBool] = None
    dimensions: Optional[StrictInt] = None
    options: Optional[dict[str, Any]] = None
    keep_alive: Optional[Union[StrictStr, StrictInt, float]] = None


class OllamaEmbeddingsRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: Optional[StrictStr] = None
    prompt: StrictStr
    options: Optional[dict[str, Any]] = None
    keep_alive: Optional[Union[StrictStr, StrictInt, float]] = None


def documents(inputs: Any, truncate: bool) -> list[EmbeddingDocument]:
    """One document per input, in order."""
    if isinstance(inputs, str) or (isinstance(inputs, list) and inputs and isinstance(inputs[0], int)):
        inputs = [inputs]
    if not inputs:
        raise BadRequest("input: at least one input", "input")
    if len(inputs) > MAX_INPUTS:
        raise BadRequest(f"input: at most {MAX_INPUTS} inputs, got {len(inputs)}", "input")
    return [EmbeddingDocument(text=one, truncate=truncate) if isinstance(one, str)
            else EmbeddingDocument(token_ids=one, truncate=truncate) for one in inputs]


def check_model(name: Optional[str], info: dict) -> None:
    """The request names the embedding model: its id, or Ollama's name (with `:latest`)."""
    model_id = info["model_id"]
    if not name:
        raise BadRequest(f"model: required; the embedding model served is '{model_id}'", "model")
    if name not in (model_id, f"{model_id}:latest"):
        raise NotServed(f"model '{name}' not found; the embedding model served is '{model_id}'", "model")


def check_dimensions(dimensions: Optional[int], info: dict) -> None:
    if dimensions is not None and dimensions != info["dimensions"]:
        raise BadRequest(f"dimensions: only the model's own, {info['dimensions']}, is served", "dimensions")


def check_options(options: Optional[dict[str, Any]]) -> None:
    """Ollama's options shape sampling and the context, neither of which changes a vector: refused
    unless null (LangChain's OllamaEmbeddings sends every one, null)."""
    for name, value in (options or {}).items():
        if value is not None:
            raise BadRequest(f"options.{name}: not served for embeddings", "options")


async def _embedded(backend: Upstream, docs: list[EmbeddingDocument]) -> tuple[list[EmbeddingDocument], int]:
    """The embedded documents and their tokens; the first input's refusal as a BadRequest."""
    out = await backend.embed(docs)
    failed = next((d for d in out if d.error is not None), None)
    if failed is not None:
        raise BadRequest(failed.error or "", failed.error_field, error_kind(failed.error_type))
    return out, sum(d.prompt_tokens or 0 for d in out)


async def _info(backend: Upstream) -> dict:
    info = await backend.embed_info()
    if info is None:
        raise NotServed("model: no embedding model is served here (LLM_EMBEDDING_MODEL)", "model")
    return info


def _vector(doc: EmbeddingDocument, base64_: bool) -> Union[list[float], str]:
    vector = np.asarray(doc.embedding, dtype="<f4")
    return base64.b64encode(vector.tobytes()).decode() if base64_ else vector.tolist()


def embedding_router(backend: Upstream) -> APIRouter:
    router = APIRouter(tags=["Embeddings"])

    @router.post("/v1/embeddings", summary="OpenAI: embeddings of one input or several")
    async def openai_embeddings(request: Request) -> Response:
        try:
            req = await parse_body(request, OpenAIEmbeddingRequest)
            OPENAI_FIELDS.check(req)
            if req.encoding_format not in (None, "float", "base64"):
                raise BadRequest("encoding_format: must be float or base64", "encoding_format")
            info = await _info(backend)
            check_model(req.model, info)
            check_dimensions(req.dimensions, info)
            out, tokens = await _embedded(backend, documents(req.input, truncate=False))
        except BadRequest as exc:
            return JSONResponse(error_body(str(exc), exc.kind, exc.param), status_code=OPENAI_STATUS[exc.kind])
        data = [{"object": "embedding", "index": i, "embedding": _vector(d, req.encoding_format == "base64")}
                for i, d in enumerate(out)]
        return JSONResponse({"object": "list", "data": data, "model": info["model_id"],
                             "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

    @router.post("/api/embed", summary="Ollama: embeddings of one input or several")
    async def ollama_embed(request: Request) -> Response:
        started = time.perf_counter_ns()
        try:
            req = await parse_body(request, OllamaEmbedRequest)
            OLLAMA_FIELDS.check(req)
            check_options(req.options)
            info = await _info(backend)
            check_model(req.model, info)
            check_dimensions(req.dimensions, info)
            out, tokens = await _embedded(backend, documents(req.input, truncate=req.truncate is not False))
        except BadRequest as exc:
            return error(str(exc), exc.kind)
        return JSONResponse({"model": req.model, "embeddings": [_vector(d, False) for d in out],
                             "total_duration": time.perf_counter_ns() - started, "load_duration": 0,
                             "prompt_eval_count": tokens})

    @router.post("/api/embeddings", summary="Ollama's older route: the embedding of one prompt")
    async def ollama_embeddings(request: Request) -> Response:
        try:
            req = await parse_body(request, OllamaEmbeddingsRequest)
            OLLAMA_OLD_FIELDS.check(req)
            check_options(req.options)
            check_model(req.model, await _info(backend))
            out, _ = await _embedded(backend, documents(req.prompt, truncate=True))
        except BadRequest as exc:
            return error(str(exc), exc.kind)
        return JSONResponse({"embedding": _vector(out[0], False)})

    return router

