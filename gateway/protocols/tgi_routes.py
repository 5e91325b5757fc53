"""Text Generation Inference (TGI) compatible routes, so TGI clients work unchanged.

POST /generate, POST /generate_stream, POST / (dispatches on `stream`, what
huggingface_hub's InferenceClient calls), GET /info, GET /health.
Errors: {"error": ..., "error_type": ...} with 422 (validation), 429 (overloaded),
500 (generation); in a stream, the same object as the last event. `parameters` takes
TGI's names (DJL Serving's too) and every other request field of the engine under its
own name. The fields are declared once (REQUEST_FIELDS, PARAMETERS, which docs/api.md's tables
follow): one that neither declares, at the top or in `parameters`, is refused with 422 naming
it, and so is one that TGI serves under another name (`max_tokens`: TGI's `max_new_tokens`).
"""
import re
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Optional

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, create_model

from contract import MAX_CHOICES, ServerInfo
from contract.transport import HTTP_STATUS
from gateway.edge.backend import CollectedAnswer
from gateway.mapping.api_fields import ApiFields, refused, served
from gateway.mapping.inputs import (
    BadRequest,
    Bool,
    Int,
    Stop,
    option_fields,
    parse_body,
    prompt_document,
    sampling_options,
    set_options,
    stop_list,
)
from gateway.mapping.logprobs import alternatives
from gateway.mapping.protocol import Parsed, Protocol, Upstream, kind, serve, sse
from gateway.mapping.structured_output import TGIGrammar, tgi_constraint
from schemas import ModelOutputDocument

DEFAULT_MAX_NEW_TOKENS = 20  # TGI's documented default
# TGI's: max_new_tokens, stop as a string or a list, grammar, top_n_tokens, best_of, decoder_input_details
SPELLED_BY_TGI = ("max_tokens", "stop", "grammar", "top_logprobs", "n", "prompt_logprobs")
TGI_FIELD_NAMES = {"prompt": "inputs", "max_tokens": "max_new_tokens", "top_logprobs": "top_n_tokens",  # ours -> TGI's
                   "n": "best_of", "prompt_logprobs": "decoder_input_details"}
# the engine's names for what TGI names otherwise: refused under them here (unless neutral), pointing at TGI's
_ENGINE_NAMES = re.compile(r"\b(max_tokens|top_logprobs|prompt_logprobs)\b")  # those no English word hides
SPELLED_OTHERWISE = {"max_tokens": (), "top_logprobs": (0,), "n": (1,), "prompt_logprobs": (False,)}
REQUEST_FIELDS = ApiFields("TGI's request", (
    *served("inputs", "parameters", "stream"),
    refused("add_special_tokens", True)))  # a prompt is always tokenized with the model's special tokens
PARAMETERS = ApiFields("TGI's parameters", (
    *served("max_new_tokens", "stop", "details", "return_full_text", "best_of", "decoder_input_details",
            "top_n_tokens", "grammar", "do_sample", "temperature", "top_k", "top_p", "typical_p",
            "repetition_penalty", "frequency_penalty", "seed"),
    refused("watermark", False), refused("truncate"), refused("adapter_id"),
    *(refused(name, *neutral, instead=f"TGI's name for it is {TGI_FIELD_NAMES[name]}")
      for name, neutral in SPELLED_OTHERWISE.items())),
    tuple(option_fields(exclude=SPELLED_BY_TGI)))  # the engine's other fields, under their own names


class _TGIParameters(BaseModel):
    """Null options are the defaults, as TGI clients send many; the rest arrive as extras, which
    PARAMETERS refuses unless it declares them (and they are neutral)."""

    model_config = ConfigDict(extra="allow")
    max_new_tokens: Int = None
    stop: Stop = None
    details: Bool = False
    return_full_text: Bool = False
    best_of: Int = None  # the engine's n; the likeliest answer is returned
    decoder_input_details: Bool = False  # the engine's prompt_logprobs
    top_n_tokens: Int = None  # the engine's top_logprobs
    grammar: Optional[TGIGrammar] = None


if TYPE_CHECKING:  # what mypy sees of the model built below (one made at import has no static type)
    class TGIParameters(_TGIParameters):
        do_sample: Bool = None  # the two of the engine's other fields that this module reads
        seed: Int = None
else:
    TGIParameters = create_model("TGIParameters", __base__=_TGIParameters, **option_fields(exclude=SPELLED_BY_TGI))


class TGIRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # the rest arrive as extras: REQUEST_FIELDS refuses them
    inputs: str
    parameters: TGIParameters = TGIParameters()
    stream: Bool = None  # POST /'s choice; the other routes' own, or refused


def check_fields(req: TGIRequest) -> None:
    """Refuse a field neither declaration names, or a refused one that is not neutral. The error
    names the field as it was sent (no param: the refusal would rename `n` to TGI's `best_of`)."""
    try:
        REQUEST_FIELDS.check(req)
        PARAMETERS.check(req.parameters)
    except BadRequest as exc:
        raise BadRequest(str(exc)) from None


def to_fields(p: TGIParameters) -> dict:
    """TGI samples when asked to, or when any warper is set (like TGI's NextTokenChooser)."""
    return {**set_options(p, exclude=SPELLED_BY_TGI), **tgi_constraint(p.grammar),
            "do_sample": bool(p.do_sample) or bool(sampling_options(p)),
            "stop": stop_list(p.stop), "max_tokens": p.max_new_tokens if p.max_new_tokens is not None else DEFAULT_MAX_NEW_TOKENS,
            **({"top_logprobs": p.top_n_tokens} if p.top_n_tokens else {}),
            **({"n": p.best_of} if p.best_of is not None else {}),
            **({"prompt_logprobs": True} if p.decoder_input_details else {})}


def _details(last: ModelOutputDocument, stream: bool, input_length: int) -> dict:
    details = {"finish_reason": last.finish_reason, "generated_tokens": last.generated_tokens,
               "seed": last.seed}
    if stream:
        details["input_length"] = input_length
    return details


def _prefill(first: ModelOutputDocument) -> list[dict]:
    """decoder_input_details: the prompt's tokens, each with its log probability (the
    first has none), from the answer's first document."""
    logprobs = [None, *first.prompt_logprobs] if first.prompt_token_ids else []
    return [{"id": i, "text": t, "logprob": lp}
            for i, t, lp in zip(first.prompt_token_ids, first.prompt_token_texts, logprobs, strict=True)]


def _sequence(docs: list[ModelOutputDocument], prefix: str, top_n: bool) -> dict[str, Any]:
    """One answer as TGI's details describe it: text, finish, prefill and tokens."""
    events = [e for d in docs for e in token_events(d)]
    body = {"generated_text": prefix + "".join(d.text for d in docs),
            **_details(docs[-1], False, 0), "prefill": _prefill(docs[0]), "tokens": [e["token"] for e in events]}
    if top_n:
        body["top_tokens"] = [e.get("top_tokens", []) for e in events]
    return body


def _likelihood(docs: list[ModelOutputDocument]) -> float:
    """best_of picks the answer whose tokens are likeliest together, as TGI does."""
    return sum(lp for d in docs for lp in d.logprobs)


def token_events(out: ModelOutputDocument) -> list[dict]:
    """One TGI event per token, from the document's per-token lists: a document covering
    several tokens (the reader fell behind) gives the same events as one per token."""
    first_index = out.index - len(out.token_ids) + 1
    events: list[dict[str, Any]] = [
        {"index": first_index + i + 1, "token": {"id": tid, "text": text, "logprob": logprob, "special": special},
         "generated_text": None, "details": None}
        for i, (tid, text, logprob, special)
        in enumerate(zip(out.token_ids, out.texts, out.logprobs, out.specials, strict=True))]
    if out.alternative_counts:  # top_n_tokens
        for event, alts in zip(events, alternatives(out), strict=True):
            event["top_tokens"] = [{"id": i, "text": t, "logprob": lp, "special": False} for i, t, lp in alts]
    return events


class TGI(Protocol):
    """POST /generate (stream=False) and /generate_stream (stream=True); `/` reads `stream`."""

    def __init__(self, stream: Optional[bool] = None, listed: bool = False):
        self.stream, self.listed = stream, listed  # listed: `/` answers a one-element list

    async def parse(self, request: Request, backend: Upstream) -> Parsed:
        req = await parse_body(request, TGIRequest)
        check_fields(req)
        if self.stream is not None and req.stream is not None and req.stream != self.stream:
            raise BadRequest(f"stream: {request.url.path} {'streams' if self.stream else 'answers whole'}; "
                             f"POST / takes `stream`", "stream")
        stream = bool(req.stream) if self.stream is None else self.stream
        p = req.parameters
        several = p.best_of is not None and p.best_of > 1  # below 1: the engine's bound on n, under TGI's name
        if stream and several:
            raise BadRequest("best_of: > 1 is not supported when streaming tokens", "best_of")
        if stream and p.decoder_input_details:
            raise BadRequest("decoder_input_details: == true is not supported when streaming tokens",
                             "decoder_input_details")
        fields = to_fields(p)
        if several and not fields["do_sample"]:
            raise BadRequest("best_of: you must use sampling when `best_of` is > 1", "best_of")
        if several and p.seed is not None:
            raise BadRequest("seed: must not be set when `best_of` > 1", "seed")
        doc = prompt_document(prompt=req.inputs, **fields)
        sent_as = {name: "grammar" for name in tgi_constraint(p.grammar)}
        return Parsed(doc, stream, req, sent_as)

    def refusal(self, error: ModelOutputDocument) -> Response:
        """Errors name the field as TGI's clients know it (inputs, max_new_tokens), and so do the
        words after it (`(0 only scores a prompt, with decoder_input_details)`)."""
        message = error.error or ""
        if error.error_field in TGI_FIELD_NAMES:
            message = TGI_FIELD_NAMES[error.error_field] + message.removeprefix(error.error_field)
        if error.error_field:  # a field's refusal, in the engine's words (the gateway's own use TGI's names)
            message = _ENGINE_NAMES.sub(lambda m: TGI_FIELD_NAMES[m.group(0)], message)
        return JSONResponse({"error": message, "error_type": error.error_type}, status_code=HTTP_STATUS[kind(error)])

    async def events(self, parsed: Parsed, docs: AsyncIterator[ModelOutputDocument],
                     info: Optional[ServerInfo]) -> AsyncIterator[str]:
        req = parsed.request
        prefix = req.inputs if req.parameters.return_full_text else ""
        async for out in docs:
            if out.error is not None:
                yield sse({"error": out.error, "error_type": out.error_type})
                return
            events = token_events(out)
            if out.finish_reason is not None:
                events[-1]["generated_text"] = prefix + out.generated_text
                if req.parameters.details:
                    events[-1]["details"] = _details(out, True, out.prompt_tokens or 0)
            for event in events:
                yield sse(event)

    def answer(self, parsed: Parsed, result: CollectedAnswer, info: Optional[ServerInfo]) -> Response:
        p = parsed.request.parameters
        prefix = parsed.request.inputs if p.return_full_text else ""
        answers = sorted(result.answers(), key=_likelihood, reverse=True)  # best_of: the likeliest first
        best = _sequence(answers[0], prefix, bool(p.top_n_tokens))
        body: dict = {"generated_text": best.pop("generated_text")}
        if p.details:
            body["details"] = best
            if len(answers) > 1:
                body["details"]["best_of_sequences"] = [_sequence(a, prefix, bool(p.top_n_tokens))
                                                        for a in answers[1:]]
        return JSONResponse([body] if self.listed else body)


def tgi_router(backend: Upstream) -> APIRouter:
    router = APIRouter(tags=["TGI"])

    @router.post("/generate_stream", summary="TGI: stream tokens as Server-Sent Events")
    async def generate_stream(request: Request) -> Response:
        return await serve(TGI(stream=True), backend, request)

    @router.post("/generate", summary="TGI: the whole generation at once")
    async def generate(request: Request) -> Response:
        return await serve(TGI(stream=False), backend, request)

    @router.post("/", summary="TGI compat: /generate or /generate_stream depending on `stream`")
    async def compat(request: Request) -> Response:
        return await serve(TGI(listed=True), backend, request)

    @router.get("/info", summary="TGI: model id and limits")
    async def info() -> dict:
        return tgi_info(await backend.info())

    return router


def tgi_info(info: ServerInfo) -> dict:
    return {"model_id": info.model_id, "model_sha": None, "model_dtype": info.dtype,
            "model_device_type": info.device.split(":")[0], "model_pipeline_tag": "text-generation",
            "max_concurrent_requests": info.max_concurrent, "max_best_of": MAX_CHOICES,
            "max_stop_sequences": info.max_stop_sequences, "max_input_tokens": info.max_context - 1,
            "max_total_tokens": info.max_context, "max_batch_total_tokens": info.kv_cache_tokens or info.max_batch_tokens,
            "max_client_batch_size": 1, "validation_workers": 1, "waiting_served_ratio": 0,
            "max_waiting_tokens": 0, "router": "llm-stream (Jina)", "version": "0.1.0", "sha": None,
            "docker_label": None,
            # beyond TGI's: the KV cache's pool, blocks and dtype, whether prompts reuse cached prefixes, and
            # the replicas behind the gateway with its router's policy, and the LoRA adapters it serves
            "kv_cache_tokens": info.kv_cache_tokens, "kv_block_size": info.kv_block_size,
            "kv_window_tokens": info.kv_window_tokens,
            "kv_cache_dtype": info.kv_cache_dtype, "prefix_caching": info.prefix_caching, "replicas": info.replicas, "routing": info.routing,
            "adapters": info.adapters}
