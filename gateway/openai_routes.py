"""OpenAI-compatible routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models.

Sampling follows OpenAI's defaults: temperature absent means 1.0 *with sampling*;
temperature 0 is greedy. Chat messages travel to the executor as JSON and the
engine renders them (chat template, or its plain format). `model` is accepted
whatever it says: one model is served, and its id is what responses report.
"""
import uuid
from typing import Any, AsyncIterator, Optional, Union

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict

from schemas import ModelOutputDocument, PromptDocument

from gateway.backend import (SSE_HEADERS, STATUS, Backend, BadRequest, Bool, Int, Number,
                             cancel_on_disconnect, close_quietly, now, parse_body, prompt_document,
                             sse)

FINISH = {"length": "length", "eos_token": "stop", "stop_sequence": "stop"}
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
_ERROR_TYPES = {"validation": "invalid_request_error", "overloaded": "overloaded_error"}


class StreamOptions(BaseModel):
    include_usage: Optional[bool] = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: Optional[str] = None
    max_tokens: Int = None
    temperature: Number = None
    top_p: Number = None
    n: Int = 1
    seed: Int = None
    stop: Optional[Union[str, list[str]]] = None
    stream: Bool = False
    stream_options: Optional[StreamOptions] = None


class CompletionRequest(_Common):
    prompt: Union[str, list[str]]
    echo: Bool = False


class ChatRequest(_Common):
    messages: list[dict[str, Any]]
    max_completion_tokens: Int = None


def openai_error(message: str, error_type: str, param: Optional[str] = None) -> JSONResponse:
    """Validation errors are 400 here (OpenAI's), not TGI's 422; `param` is the field."""
    status = 400 if error_type == "validation" else STATUS.get(error_type, 500)
    return JSONResponse({"error": {"message": message, "type": _ERROR_TYPES.get(error_type, "server_error"),
                                   "param": param, "code": error_type}}, status_code=status)


def _error_event(out: ModelOutputDocument) -> str:
    return sse({"error": {"message": out.error, "type": _ERROR_TYPES.get(out.error_type or "", "server_error"),
                          "param": out.error_field, "code": out.error_type}})


async def _parse(request: Request, model: type[_Common]) -> Union[_Common, JSONResponse]:
    try:
        req = await parse_body(request, model)
    except BadRequest as exc:
        return openai_error(str(exc), "validation", exc.param)
    if req.n not in (None, 1):
        return openai_error("n: only n=1 is supported", "validation", "n")
    if isinstance(req, CompletionRequest) and isinstance(req.prompt, list) and len(req.prompt) != 1:
        return openai_error("prompt: one prompt per request", "validation", "prompt")
    return req


def to_document(req: _Common, max_tokens: int, **fields: Any) -> PromptDocument:
    """OpenAI always samples at its temperature (default 1); temperature 0 means greedy."""
    stop = [req.stop] if isinstance(req.stop, str) else (req.stop or [])
    stop = [s for s in stop if s]  # OpenAI clients send "" for "no stop"
    fields.update(max_tokens=max_tokens, do_sample=True, stop=stop,
                  temperature=1.0 if req.temperature is None else req.temperature)
    if req.top_p is not None:
        fields["top_p"] = req.top_p
    if req.seed is not None:
        fields["seed"] = req.seed
    return prompt_document(**fields)


def _usage(last: ModelOutputDocument) -> dict:
    p, c = last.prompt_tokens or 0, last.generated_tokens or 0
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


class _Shape:
    """What differs between completions and chat: the object names and where text goes."""

    def __init__(self, chat: bool, model: str):
        self.chat, self.model = chat, model
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = now()

    def envelope(self, obj: str, choices: list, **extra: Any) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "choices": choices, **extra}

    def chunk(self, text: Optional[str], finish: Optional[str], role: bool = False) -> dict:
        if self.chat:
            delta: dict = {"role": "assistant", "content": ""} if role else {}
            if text is not None:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            return self.envelope("chat.completion.chunk", [choice])
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        return self.envelope("text_completion", [choice])

    def whole(self, text: str, finish: Optional[str], usage: dict, seed: Optional[int]) -> dict:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "logprobs": None, "finish_reason": finish}
            return self.envelope("chat.completion", [choice], usage=usage, **_seed(seed))
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        return self.envelope("text_completion", [choice], usage=usage, **_seed(seed))


def _seed(seed: Optional[int]) -> dict:
    """An extension field: the seed a sampled answer used, so it can be replayed."""
    return {} if seed is None else {"seed": seed}


async def _chunks(shape: _Shape, first: ModelOutputDocument, rest: AsyncIterator[ModelOutputDocument],
                  include_usage: bool, prefix: str = "") -> AsyncIterator[str]:
    usage_field = {"usage": None} if include_usage else {}
    out: Optional[ModelOutputDocument] = first
    try:
        if shape.chat:
            yield sse({**shape.chunk(None, None, role=True), **usage_field})
        elif prefix:
            yield sse({**shape.chunk(prefix, None), **usage_field})
        while out is not None:
            if out.error is not None:
                yield _error_event(out)
                break
            finish = FINISH.get(out.finish_reason or "", None) if out.finish_reason else None
            yield sse({**shape.chunk(out.text, finish), **usage_field, **_seed(out.seed)})
            if out.finish_reason is not None:
                if include_usage:
                    yield sse(shape.envelope(shape.chunk(None, None)["object"], [], usage=_usage(out)))
                break
            out = await anext(rest, None)
        yield sse("[DONE]")
    finally:
        await close_quietly(rest)


def openai_router(backend: Backend) -> APIRouter:
    router = APIRouter(prefix="/v1", tags=["OpenAI"])

    async def run(request: Request, req: _Common, doc: PromptDocument, chat: bool, prefix: str = "") -> Response:
        shape = _Shape(chat, (await backend.info())["model_id"])
        if req.stream:
            first, rest = await backend.open(doc)
            if first.error is not None:
                await close_quietly(rest)
                return openai_error(first.error, first.error_type or "generation", first.error_field)
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return StreamingResponse(_chunks(shape, first, rest, include_usage, prefix),
                                     media_type="text/event-stream", headers=SSE_HEADERS)
        result = await cancel_on_disconnect(request.receive, backend.complete(doc))
        if result is None:
            return Response(status_code=499)
        if result.error is not None:
            return openai_error(result.error.error, result.error.error_type or "generation",
                                result.error.error_field)
        last = result.last
        return JSONResponse(shape.whole(prefix + result.text, FINISH.get(last.finish_reason or ""),
                                        _usage(last), last.seed))

    @router.post("/completions", summary="OpenAI completions (streaming with stream=true)")
    async def completions(request: Request) -> Response:
        req = await _parse(request, CompletionRequest)
        if isinstance(req, JSONResponse):
            return req
        prompt = req.prompt if isinstance(req.prompt, str) else req.prompt[0]
        max_tokens = req.max_tokens if req.max_tokens is not None else COMPLETIONS_DEFAULT_MAX_TOKENS
        try:
            doc = to_document(req, max_tokens, prompt=prompt)
        except BadRequest as exc:
            return openai_error(str(exc), "validation", exc.param)
        return await run(request, req, doc, chat=False, prefix=prompt if req.echo else "")

    @router.post("/chat/completions", summary="OpenAI chat completions (streaming with stream=true)")
    async def chat_completions(request: Request) -> Response:
        req = await _parse(request, ChatRequest)
        if isinstance(req, JSONResponse):
            return req
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        if max_tokens is None:  # OpenAI: up to the context; here half of it, within the limit
            info = await backend.info()
            max_tokens = min(info["max_tokens_limit"], info["max_context"] // 2)
        try:
            doc = to_document(req, max_tokens, messages=req.messages)
        except BadRequest as exc:
            return openai_error(str(exc), "validation", exc.param)
        return await run(request, req, doc, chat=True)

    @router.get("/models", summary="OpenAI: the one model served")
    async def models() -> dict:
        return {"object": "list", "data": [await _model_card(backend)]}

    @router.get("/models/{model_id:path}", summary="OpenAI: one model")
    async def model(model_id: str) -> Response:
        card = await _model_card(backend)
        if model_id != card["id"]:
            return openai_error(f"model: {model_id!r} is not served", "not_found", "model")
        return JSONResponse(card)

    return router


async def _model_card(backend: Backend) -> dict:
    info = await backend.info()
    return {"id": info["model_id"], "object": "model", "created": 0, "owned_by": "llm-stream",
            "max_model_len": info["max_context"]}
