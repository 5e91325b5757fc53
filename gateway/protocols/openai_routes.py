"""OpenAI-compatible routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models.

Sampling follows OpenAI's defaults: temperature absent means 1.0 *with sampling*;
temperature 0 is greedy. Every other request field of the engine is accepted under its
own name as an extension (as vLLM accepts top_k or repetition_penalty). Chat messages
travel to the executor as JSON and the engine renders them. `model` picks among the served
models (none: the first); a name none of them has is refused with 404. Each route's fields are
declared once (CHAT_FIELDS, COMPLETIONS_FIELDS, which docs/api.md's tables follow): what names who
asks is accepted and does nothing, what would change the answer and is not served is refused
unless neutral, and a field neither declares (a typo: `temprature`) is refused with 400 naming it,
as OpenAI's own API refuses an unrecognized argument.
"""
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, StrictInt, StrictStr, create_model

from contract import ErrorKind, ServerInfo
from contract.transport import OPENAI_ERROR_TYPE, OPENAI_STATUS
from gateway.edge.backend import CollectedAnswer, now
from gateway.mapping.api_fields import ApiFields, no_effect, refused, served
from gateway.mapping.inputs import (
    BadRequest,
    Bool,
    Int,
    Stop,
    Text,
    option_fields,
    parse_body,
    prompt_document,
    set_options,
    stop_list,
)
from gateway.mapping.logprobs import chat_logprobs, completion_logprobs
from gateway.mapping.policies import effort_budget, max_tokens_or_default
from gateway.mapping.protocol import Parsed, Protocol, Upstream, embedding_state, kind, serve, sse
from gateway.mapping.structured_output import OpenAIStructured, openai_constraint
from gateway.mapping.tool_calls import parts, tool_fields, whole_calls
from schemas import ModelOutputDocument

FINISH = {"length": "length", "eos_token": "stop", "stop_sequence": "stop", "tool_calls": "tool_calls"}
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
# OpenAI's own spelling of these (tools as a list, tool_choice also an object), or none (do_sample),
# logprobs: a number on completions, true or false on chat; prompt_logprobs: completions' echo
# with logprobs (vLLM's own prompt_logprobs, a number, is refused unless 0)
SPELLED_BY_OPENAI = ("max_tokens", "stop", "do_sample", "tools", "tool_choice", "logprobs", "prompt_logprobs")
EXTENSIONS = tuple(option_fields(exclude=SPELLED_BY_OPENAI))  # the engine's other fields, under their own names
# what both routes take: OpenAI's fields (the openai SDK's), vLLM's structured output, and what they refuse
_SHARED = (
    *served("model", "max_tokens", "stop", "stream", "stream_options", "n", "temperature", "top_p", "seed",
            "presence_penalty", "frequency_penalty", "logprobs", "response_format", "structured_outputs",
            "guided_json", "guided_regex", "guided_choice", "guided_grammar"),
    *no_effect("user", "metadata", "store", "service_tier"),
    refused("logit_bias", {}), refused("do_sample", True, instead="temperature 0 decodes greedily"))
CHAT_FIELDS = ApiFields("OpenAI's chat completions", (
    *_SHARED,
    *served("messages", "max_completion_tokens", "tools", "tool_choice", "parallel_tool_calls", "top_logprobs",
            "reasoning_effort"),
    *no_effect("safety_identifier", "prompt_cache_key", "prompt_cache_retention", "prompt_cache_options"),
    refused("functions", []), refused("function_call", "none", "auto"), refused("audio"),
    refused("modalities", ["text"]), refused("prediction"), refused("verbosity", "medium"),
    refused("web_search_options"), refused("moderation"), refused("prompt_logprobs", 0, False)), EXTENSIONS)
COMPLETIONS_FIELDS = ApiFields("OpenAI's completions", (
    *_SHARED, *served("prompt", "echo"),
    refused("best_of", 1), refused("suffix", ""), refused("tools", []), refused("tool_choice", "none", "auto"),
    refused("prompt_logprobs", 0, False, instead="echo with logprobs scores the prompt")), EXTENSIONS)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt option is refused, naming it
    include_usage: Optional[bool] = False
    include_obfuscation: Bool = None  # no effect: chunks carry no obfuscation padding


class _OpenAIRequest(OpenAIStructured):
    model_config = ConfigDict(extra="allow")  # the rest arrive as extras: the route's ApiFields refuse them
    model: Optional[str] = None
    max_tokens: Int = None
    stop: Stop = None
    stream: Bool = False
    stream_options: Optional[StreamOptions] = None
    # accepted, with no effect on the answer: who asks, and whether the answer is kept (it never is here)
    user: Text = None
    metadata: Optional[dict[str, Any]] = None
    store: Bool = None
    service_tier: Text = None


# temperature, top_p, seed (OpenAI's names too) and the engine's other request fields
_Common = create_model("_Common", __base__=_OpenAIRequest, **option_fields(exclude=SPELLED_BY_OPENAI))


class CompletionRequest(_Common):  # type: ignore[misc, valid-type]
    prompt: Union[str, list[str], list[StrictInt], list[list[StrictInt]]]  # text, or token ids
    echo: Bool = False
    logprobs: Int = None  # the alternatives per token, 0 to 20; null: no log probabilities


class ChatRequest(_Common):  # type: ignore[misc, valid-type]
    messages: list[dict[str, Any]]
    reasoning_effort: Optional[StrictStr] = None  # a reasoning model's thinking budget (REASONING_EFFORT_BUDGETS)
    max_completion_tokens: Int = None
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Optional[Union[str, dict[str, Any]]] = None
    logprobs: Bool = None
    # no effect: who asks, and the prompt cache's hints (the prefix cache is automatic)
    safety_identifier: Text = None
    prompt_cache_key: Text = None
    prompt_cache_retention: Text = None
    prompt_cache_options: Optional[dict[str, Any]] = None


@dataclass
class OpenAIContext:
    """A parsed OpenAI request, as the encoders read it."""

    req: Any  # CompletionRequest | ChatRequest
    id: str
    created: int = field(default_factory=now)
    prefix: str = ""  # echo: the prompt, before each completion
    # completions' logprobs: where each answer's next token's text starts in its choice's text
    offsets: dict[int, int] = field(default_factory=dict)
    started: set[int] = field(default_factory=set)  # answers whose first chunk went out


def error_body(message: str, error_kind: ErrorKind, param: Optional[str]) -> dict:
    return {"error": {"message": message, "type": OPENAI_ERROR_TYPE[error_kind],
                      "param": param, "code": error_kind.value}}


def openai_refusal(error: ModelOutputDocument) -> Response:
    """OpenAI's error answer (its routes', the Responses API's, vLLM's token routes'): validation
    errors are 400 here (OpenAI's), not TGI's 422; `param` is the field."""
    k = kind(error)
    return JSONResponse(error_body(error.error or "", k, error.error_field), status_code=OPENAI_STATUS[k])


def to_fields(req: Any, max_tokens: int) -> tuple[dict, dict[str, str]]:
    """(the document's fields, the names the request used for them where they differ).
    OpenAI always samples at its temperature (default 1); temperature 0 means greedy."""
    constraint, sent_as = openai_constraint(req)
    tools = tool_fields(getattr(req, "tools", None), getattr(req, "tool_choice", None))
    return {**set_options(req, exclude=SPELLED_BY_OPENAI), **constraint, **tools, **effort(req),
            "max_tokens": max_tokens, "do_sample": True, "stop": stop_list(req.stop, drop_empty=True)}, sent_as


def effort(req: Any) -> dict:
    """reasoning_effort (chat's) as a budget of thinking tokens, unless reasoning_budget says one."""
    if getattr(req, "reasoning_budget", None) is not None:
        return {}
    return effort_budget(getattr(req, "reasoning_effort", None), "reasoning_effort")


def _reasoning(text: str) -> dict:
    """A reasoning model's thoughts, apart from the answer, under both names clients read
    (vLLM's `reasoning`, llama.cpp's and DeepSeek's `reasoning_content`); none: no keys."""
    return {"reasoning": text, "reasoning_content": text} if text else {}


def _seed(seed: Optional[int]) -> dict:
    """An extension field: the seed a sampled answer used, so it can be replayed."""
    return {} if seed is None else {"seed": seed}


def _usage(finals: list[ModelOutputDocument]) -> dict:
    """The prompt once, and every answer's tokens; how much of the prompt the prefix cache held."""
    p = finals[0].prompt_tokens or 0 if finals else 0
    c = sum(d.generated_tokens or 0 for d in finals)
    cached = finals[0].cached_tokens or 0 if finals else 0
    thinking = sum(d.reasoning_tokens or 0 for d in finals)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c,
            "prompt_tokens_details": {"cached_tokens": cached},
            **({"completion_tokens_details": {"reasoning_tokens": thinking}} if thinking else {})}


class OpenAI(Protocol):
    """What completions and chat share: errors, the envelope, the stream's shape."""

    chat = False
    obj, chunk_obj = "text_completion", "text_completion"

    def refusal(self, error: ModelOutputDocument) -> Response:
        return openai_refusal(error)

    def envelope(self, parsed: Parsed, obj: str, choices: list, info: Optional[ServerInfo], **extra: Any) -> dict:
        assert info is not None
        context: OpenAIContext = parsed.request
        return {"id": context.id, "object": obj, "created": context.created,
                "model": info.model_id, "choices": choices, **extra}

    def choice(self, index: int, text: Optional[str], finish: Optional[str], first: bool = False,
               calls: Optional[list[dict]] = None, logprobs: Optional[dict] = None, reasoning: str = "") -> dict:
        return {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish,
                **_reasoning(reasoning)}

    def message(self, index: int, text: str, finish: Optional[str], calls: list[dict],
                logprobs: Optional[dict] = None, reasoning: str = "") -> dict:
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish, **_reasoning(reasoning)}

    def logprobs(self, parsed: Parsed, docs: list[ModelOutputDocument]) -> Optional[dict]:
        """OpenAI's logprobs of these documents' tokens (one answer's), when the request asked;
        the prompt's too with echo, in the answer's first chunk."""
        if parsed.request.req.logprobs is None:
            return None
        context: OpenAIContext = parsed.request
        choice = docs[0].choice_index
        offset = context.offsets.setdefault(choice, len(context.prefix))  # tokens come after the echo
        out = completion_logprobs(docs, offset)
        context.offsets[choice] = offset + sum(len(t) for d in docs for t in d.texts)
        return out

    def opening(self, parsed: Parsed) -> Optional[str]:
        """The chunk each answer's stream starts with, before its first token (None: none)."""
        return None

    def prefix(self, parsed: Parsed) -> str:
        """What each answer's text starts with (completions' echo: the prompt)."""
        return ""

    async def events(self, parsed: Parsed, docs: AsyncIterator[ModelOutputDocument],
                     info: Optional[ServerInfo]) -> AsyncIterator[str]:
        context: OpenAIContext = parsed.request
        req = context.req
        usage = {"usage": None} if req.stream_options and req.stream_options.include_usage else {}
        finals: list[ModelOutputDocument] = []
        async for out in docs:
            if out.error is not None:
                yield sse(error_body(out.error, kind(out), out.error_field))
                break
            index, text = out.choice_index, out.text
            if index not in context.started:
                context.started.add(index)
                text = self.prefix(parsed) + text
                opening = self.opening(parsed)
                if opening is not None:
                    yield sse({**self.envelope(parsed, self.chunk_obj, [self.choice(index, opening, None, True)],
                                               info), **usage})
            finish = FINISH.get(out.finish_reason or "")
            choice = self.choice(index, text, finish, calls=parts(out), logprobs=self.logprobs(parsed, [out]),
                                 reasoning=out.reasoning)
            yield sse({**self.envelope(parsed, self.chunk_obj, [choice], info), **usage, **_seed(out.seed)})
            if out.finish_reason is not None:
                finals.append(out)
        if usage and len(finals) == parsed.doc.n:
            yield sse(self.envelope(parsed, self.chunk_obj, [], info, usage=_usage(finals)))
        yield sse("[DONE]")

    def answer(self, parsed: Parsed, result: CollectedAnswer, info: Optional[ServerInfo]) -> Response:
        choices, finals = [], []
        for docs in result.answers():
            last = docs[-1]
            finals.append(last)
            text = self.prefix(parsed) + "".join(d.text for d in docs)
            choices.append(self.message(last.choice_index, text, FINISH.get(last.finish_reason or ""),
                                        whole_calls(docs), self.logprobs(parsed, docs),
                                        "".join(d.reasoning for d in docs)))
        seed = _seed(finals[0].seed) if len(finals) == 1 else {}
        return JSONResponse(self.envelope(parsed, self.obj, choices, info, usage=_usage(finals), **seed))


class OpenAICompletions(OpenAI):
    async def parse(self, request: Request, backend: Upstream) -> Parsed:
        req = await parse_body(request, CompletionRequest)
        COMPLETIONS_FIELDS.check(req)
        prompt, ids = _prompt(req.prompt)
        max_tokens = req.max_tokens if req.max_tokens is not None else COMPLETIONS_DEFAULT_MAX_TOKENS
        if ids and req.echo:
            raise BadRequest("echo: the prompt's text is not known for a prompt of token ids", "echo")
        context = OpenAIContext(req, "cmpl-" + uuid.uuid4().hex, prefix=prompt if req.echo else "")
        fields, sent_as = to_fields(req, max_tokens)
        if req.logprobs is not None:
            fields.update(logprobs=True, top_logprobs=req.logprobs)
            sent_as["top_logprobs"] = "logprobs"
        if req.echo and (req.logprobs is not None or max_tokens == 0):  # the prompt's own numbers, as vLLM
            fields["prompt_logprobs"] = True
        return Parsed(prompt_document(prompt=prompt, prompt_token_ids=ids, **fields), bool(req.stream), context,
                      {**sent_as, "prompt_token_ids": "prompt"})

    def prefix(self, parsed: Parsed) -> str:
        return parsed.request.prefix


def _prompt(prompt: Any) -> tuple[str, list[int]]:
    """(text, token ids) of completions' one prompt: a string, a list of one string, a list of
    token ids, or a list of one such list."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (list, str)):
        if len(prompt) != 1:
            raise BadRequest("prompt: one prompt per request", "prompt")
        prompt = prompt[0]
    if isinstance(prompt, list):
        return "", prompt
    return prompt, []



class OpenAIChat(OpenAI):
    chat = True
    obj, chunk_obj = "chat.completion", "chat.completion.chunk"

    async def parse(self, request: Request, backend: Upstream) -> Parsed:
        req = await parse_body(request, ChatRequest)
        CHAT_FIELDS.check(req)
        context = OpenAIContext(req, "chatcmpl-" + uuid.uuid4().hex)
        asked = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        max_tokens = await max_tokens_or_default(asked, req.model, backend.info)  # OpenAI: up to the context
        fields, sent_as = to_fields(req, max_tokens)
        if req.top_logprobs and not req.logprobs:
            raise BadRequest("top_logprobs: needs logprobs: true", "top_logprobs")
        fields["logprobs"] = bool(req.logprobs)
        return Parsed(prompt_document(messages=req.messages, **fields), bool(req.stream), context, sent_as)

    def opening(self, parsed: Parsed) -> Optional[str]:
        return ""  # the role, in a chunk of its own

    def choice(self, index: int, text: Optional[str], finish: Optional[str], first: bool = False,
               calls: Optional[list[dict]] = None, logprobs: Optional[dict] = None, reasoning: str = "") -> dict:
        delta: dict = {"role": "assistant", "content": ""} if first else {}
        if text is not None and (text or not (calls or reasoning)):
            delta["content"] = text
        if calls:
            delta["tool_calls"] = calls
        return {"index": index, "delta": {**delta, **_reasoning(reasoning)}, "logprobs": logprobs,
                "finish_reason": finish}

    def message(self, index: int, text: str, finish: Optional[str], calls: list[dict],
                logprobs: Optional[dict] = None, reasoning: str = "") -> dict:
        message: dict = {"role": "assistant", "content": text if text or not calls else None, **_reasoning(reasoning)}
        if calls:
            message["tool_calls"] = calls
        return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish}

    def logprobs(self, parsed: Parsed, docs: list[ModelOutputDocument]) -> Optional[dict]:
        return chat_logprobs(docs) if parsed.request.req.logprobs else None


def openai_router(backend: Upstream) -> APIRouter:
    router = APIRouter(prefix="/v1", tags=["OpenAI"])

    @router.post("/completions", summary="OpenAI completions (streaming with stream=true)")
    async def completions(request: Request) -> Response:
        return await serve(OpenAICompletions(), backend, request)

    @router.post("/chat/completions", summary="OpenAI chat completions (streaming with stream=true)")
    async def chat_completions(request: Request) -> Response:
        return await serve(OpenAIChat(), backend, request)

    @router.get("/models", summary="OpenAI: the models served (the generating ones, then the embedding one)")
    async def models() -> dict:
        return {"object": "list", "data": await _model_cards(backend)}

    @router.get("/models/{model_id:path}", summary="OpenAI: one model")
    async def model(model_id: str) -> Response:
        for card in await _model_cards(backend):
            if model_id == card["id"]:
                return JSONResponse(card)
        return JSONResponse(error_body(f"model: {model_id!r} is not served", ErrorKind.NOT_FOUND, "model"),
                            status_code=404)

    return router


async def _model_cards(backend: Upstream) -> list[dict]:
    """Each served model, with the tokens it takes (a prompt and its answer; an embedding's input)."""
    embedding = await backend.embed_info(live=True)
    cards = [*((info.model_id, info.max_context, info.state) for info in await backend.models(live=True)),
             *([(embedding["model_id"], embedding["max_tokens"], embedding_state(embedding))] if embedding else [])]
    return [{"id": model_id, "object": "model", "created": 0, "owned_by": "llm-stream", "max_model_len": tokens,
             "state": state} for model_id, tokens, state in cards]
