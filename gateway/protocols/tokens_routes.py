"""Tokens in and out, in vLLM's shapes: POST /tokenize (a prompt, or chat messages through the
model's template, with tools) and POST /detokenize. Routers, evaluation harnesses and trainers use
them beside prompts given as token ids (OpenAI completions' `prompt`, PromptDocument's
`prompt_token_ids`)."""
from typing import Any, Optional, Union

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, StrictBool, StrictInt, StrictStr

from contract import ErrorKind, ModelNotServedError
from gateway.edge.backend import error_doc
from gateway.mapping.api_fields import ApiFields, refused, served
from gateway.mapping.inputs import BadRequest, parse_body, prompt_document
from gateway.mapping.protocol import Upstream
from gateway.mapping.tool_calls import tool_fields
from gateway.protocols.openai_routes import error_body, openai_refusal

# every field of a /tokenize request; what would change the tokens and is not served is refused
FIELDS = ApiFields("vLLM's /tokenize", (
    *served("model", "prompt", "messages", "add_special_tokens", "add_generation_prompt", "tools"),
    refused("continue_final_message", False), refused("chat_template"), refused("chat_template_kwargs", {}),
    refused("return_token_strs", False), refused("mm_processor_kwargs", {})))


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: Optional[StrictStr] = None
    prompt: Optional[StrictStr] = None
    messages: Optional[list[dict[str, Any]]] = None
    add_special_tokens: Optional[StrictBool] = None
    add_generation_prompt: Optional[StrictBool] = None
    tools: Optional[list[dict[str, Any]]] = None


DETOKENIZE_FIELDS = ApiFields("vLLM's /detokenize", served("model", "tokens"))


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # the rest arrive as extras: DETOKENIZE_FIELDS refuses them
    model: Optional[StrictStr] = None
    tokens: list[StrictInt]


def tokenize_document(req: TokenizeRequest) -> Any:
    """The request as a document; the defaults that cannot change (the engine tokenizes a prompt
    with its special tokens, and renders a chat with its generation prompt) are refused if changed."""
    FIELDS.check(req)
    if (req.prompt is None) == (req.messages is None):
        raise BadRequest("prompt: give a prompt or messages, not both", "prompt")
    if req.prompt is not None:
        if req.add_special_tokens is False:
            raise BadRequest("add_special_tokens: prompts are tokenized with the model's special tokens",
                             "add_special_tokens")
        return prompt_document(prompt=req.prompt, model=req.model)
    if req.add_generation_prompt is False or req.add_special_tokens is True:
        name = "add_generation_prompt" if req.add_generation_prompt is False else "add_special_tokens"
        raise BadRequest(f"{name}: chats are rendered with their generation prompt, as a request's", name)
    return prompt_document(messages=req.messages, model=req.model, **tool_fields(req.tools, None))


def tokens_router(backend: Upstream) -> APIRouter:
    router = APIRouter(tags=["Tokens"])

    @router.post("/tokenize", summary="vLLM's: a prompt's (or chat's) token ids")
    async def tokenize(request: Request) -> Response:
        try:
            doc = tokenize_document(await parse_body(request, TokenizeRequest))
            info = await backend.info(doc.model)  # a model none serves: 404 before any work
        except BadRequest as exc:
            return JSONResponse(error_body(str(exc), ErrorKind.VALIDATION, exc.param), status_code=400)
        except ModelNotServedError as exc:
            return openai_refusal(error_doc(str(exc), exc.kind, exc.field))
        out = await backend.tokenize(doc)
        if out.error is not None:
            return openai_refusal(out)
        return JSONResponse({"count": len(out.token_ids), "max_model_len": info.max_context,
                             "tokens": list(out.token_ids), "token_strs": None})

    @router.post("/detokenize", summary="vLLM's: token ids as text")
    async def detokenize(request: Request) -> Response:
        try:
            req: Union[DetokenizeRequest, Any] = await parse_body(request, DetokenizeRequest)
            DETOKENIZE_FIELDS.check(req)
            doc = prompt_document(prompt_token_ids=req.tokens, model=req.model)
        except BadRequest as exc:
            return JSONResponse(error_body(str(exc), ErrorKind.VALIDATION, exc.param), status_code=400)
        out = await backend.detokenize(doc)
        if out.error is not None:
            return openai_refusal(out)
        return JSONResponse({"prompt": out.text})

    return router
