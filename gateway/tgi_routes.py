"""Text Generation Inference (TGI) compatible routes, so TGI clients work unchanged.

POST /generate, POST /generate_stream, POST / (dispatches on `stream`, what
huggingface_hub's InferenceClient calls), GET /info, GET /health.
Errors: {"error": ..., "error_type": ...} with 422 (validation), 429 (overloaded),
500 (generation); in a stream, the same object as the last event.
"""
from typing import AsyncIterator, Optional, Union

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict

from schemas import ModelOutputDocument, PromptDocument

from gateway.backend import (SSE_HEADERS, STATUS, Backend, BadRequest, Bool, Int, Number,
                             cancel_on_disconnect, close_quietly, parse_body, prompt_document, sse)

DEFAULT_MAX_NEW_TOKENS = 20  # TGI's documented default


class TGIParameters(BaseModel):
    """TGI/DJL `parameters`; unknown and null options are ignored, as TGI clients send many."""

    model_config = ConfigDict(extra="ignore")
    max_new_tokens: Int = None
    do_sample: Bool = None
    temperature: Number = None
    top_k: Int = None
    top_p: Number = None
    typical_p: Number = None
    repetition_penalty: Number = None
    seed: Int = None
    stop: Optional[Union[str, list[str]]] = None
    details: Bool = False
    return_full_text: Bool = False
    best_of: Int = None


class TGIRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    inputs: str
    parameters: TGIParameters = TGIParameters()
    stream: bool = False


def error_response(message: str, error_type: str) -> JSONResponse:
    return JSONResponse({"error": message, "error_type": error_type},
                        status_code=STATUS.get(error_type, 500))


def to_document(req: TGIRequest) -> PromptDocument:
    """TGI samples when asked to, or when any warper is set (like TGI's NextTokenChooser)."""
    p = req.parameters
    warpers = ((p.temperature is not None and p.temperature != 1.0) or bool(p.top_k)
               or (p.top_p is not None and p.top_p < 1.0) or (p.typical_p is not None and p.typical_p < 1.0))
    stop = [p.stop] if isinstance(p.stop, str) else (p.stop or [])
    fields = dict(prompt=req.inputs, do_sample=bool(p.do_sample) or warpers, stop=stop,
                  max_tokens=p.max_new_tokens if p.max_new_tokens is not None else DEFAULT_MAX_NEW_TOKENS)
    for name in ("temperature", "top_k", "top_p", "typical_p", "repetition_penalty", "seed"):
        if getattr(p, name) is not None:
            fields[name] = getattr(p, name)
    return prompt_document(**fields)


async def parse(request: Request) -> Union[tuple[TGIRequest, PromptDocument], JSONResponse]:
    try:
        req = await parse_body(request, TGIRequest)
        if req.parameters.best_of not in (None, 1):
            raise BadRequest("best_of: only 1 is supported", "best_of")
        return req, to_document(req)
    except BadRequest as exc:
        return error_response(str(exc), "validation")


def _details(last: ModelOutputDocument, stream: bool, input_length: int) -> dict:
    details = {"finish_reason": last.finish_reason, "generated_tokens": last.generated_tokens,
               "seed": last.seed}
    if stream:
        details["input_length"] = input_length
    return details


def _token_events(out: ModelOutputDocument) -> list[dict]:
    """One TGI event per token. A document covering several tokens (the reader fell behind)
    carries their text together: it goes on its last token, so texts still join up."""
    n = len(out.token_ids)
    first_index = out.index - n + 1
    return [{"index": first_index + i + 1,
             "token": {"id": tid, "text": out.text if i == n - 1 else "",
                       "logprob": out.logprobs[i] if i < len(out.logprobs) else out.logprob,
                       "special": out.specials[i] if i < len(out.specials) else out.special},
             "generated_text": None, "details": None}
            for i, tid in enumerate(out.token_ids)]


async def _events(first: ModelOutputDocument, rest: AsyncIterator[ModelOutputDocument],
                  req: TGIRequest) -> AsyncIterator[str]:
    prefix = req.inputs if req.parameters.return_full_text else ""
    out: Optional[ModelOutputDocument] = first
    try:
        while out is not None:
            if out.error is not None:
                yield sse({"error": out.error, "error_type": out.error_type})
                return
            events = _token_events(out)
            if out.finish_reason is not None:
                events[-1]["generated_text"] = prefix + out.generated_text
                if req.parameters.details:
                    events[-1]["details"] = _details(out, True, out.prompt_tokens or 0)
            for event in events:
                yield sse(event)
            out = await anext(rest, None)
    finally:
        await close_quietly(rest)


def tgi_router(backend: Backend) -> APIRouter:
    router = APIRouter(tags=["TGI"])

    async def generate_stream(req: TGIRequest, doc: PromptDocument) -> Response:
        first, rest = await backend.open(doc)
        if first.error is not None:
            await close_quietly(rest)
            return error_response(first.error, first.error_type or "generation")
        return StreamingResponse(_events(first, rest, req), media_type="text/event-stream",
                                 headers=SSE_HEADERS)

    async def generate(req: TGIRequest, doc: PromptDocument, request: Request) -> Union[dict, Response]:
        result = await cancel_on_disconnect(request.receive, backend.complete(doc))
        if result is None:
            return Response(status_code=499)  # the client left; nobody reads this
        if result.error is not None:
            return error_response(result.error.error, result.error.error_type or "generation")
        body: dict = {"generated_text": (req.inputs if req.parameters.return_full_text else "") + result.text}
        if req.parameters.details:
            last = result.last
            body["details"] = {**_details(last, False, 0), "prefill": [], "tokens": [
                e["token"] for d in result.docs for e in _token_events(d)]}
        return body

    @router.post("/generate_stream", summary="TGI: stream tokens as Server-Sent Events")
    async def _generate_stream(request: Request) -> Response:
        parsed = await parse(request)
        return parsed if isinstance(parsed, JSONResponse) else await generate_stream(*parsed)

    @router.post("/generate", summary="TGI: the whole generation at once")
    async def _generate(request: Request) -> Response:
        parsed = await parse(request)
        if isinstance(parsed, JSONResponse):
            return parsed
        body = await generate(*parsed, request)
        return body if isinstance(body, Response) else JSONResponse(body)

    @router.post("/", summary="TGI compat: /generate or /generate_stream depending on `stream`")
    async def _compat(request: Request) -> Response:
        parsed = await parse(request)
        if isinstance(parsed, JSONResponse):
            return parsed
        if parsed[0].stream:
            return await generate_stream(*parsed)
        body = await generate(*parsed, request)
        return body if isinstance(body, Response) else JSONResponse([body])

    @router.get("/info", summary="TGI: model id and limits")
    async def _info() -> dict:
        info = await backend.info()
        return {"model_id": info["model_id"], "model_sha": None, "model_dtype": info["dtype"],
                "model_device_type": info["device"].split(":")[0],
                "model_pipeline_tag": "text-generation",
                "max_concurrent_requests": info["max_running"] + info["max_waiting"],
                "max_best_of": 1, "max_stop_sequences": 16,
                "max_input_tokens": info["max_context"] - 1, "max_total_tokens": info["max_context"],
                "max_batch_total_tokens": info["max_batch_tokens"],
                "max_client_batch_size": 1, "validation_workers": 1, "waiting_served_ratio": 0,
                "max_waiting_tokens": 0, "router": "llm-stream (Jina)", "version": "0.1.0",
                "sha": None, "docker_label": None}

    @router.get("/health", summary="TGI: 200 when the model answers, else 503")
    async def _health() -> Response:
        try:
            healthy = (await backend.stats()).get("healthy", False)
        except Exception:  # noqa: BLE001 - unreachable executor
            healthy = False
        return Response(status_code=200 if healthy else 503)

    return router
