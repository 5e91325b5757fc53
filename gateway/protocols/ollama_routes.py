"""Ollama's generation routes: POST /api/chat and POST /api/generate, streamed as NDJSON (one JSON
object a line) unless `stream` is false, for Ollama's clients (the ollama library, LangChain's
ChatOllama, Open WebUI, VS Code Copilot's Ollama provider).

A request maps onto the contract as every route's does (gateway/protocols/ollama_options.py declares the
fields). A chat's messages become the engine's conversation; /api/generate renders its prompt as
one user turn in the model's chat template (with `system` before it) unless `raw` is true. An
answer's tool calls come whole, in a line of their own before the last, as Ollama sends them. The
last line has `done: true`, `done_reason` and the counts; its durations, in nanoseconds, are measured
at the gateway: the prompt's until the first token, the answer's from there. A request with no
messages (or an empty prompt) loads the model, which is loaded already: `done_reason: "load"`.
"""
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Optional

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from contract import ServerInfo
from gateway.edge.backend import CollectedAnswer
from gateway.mapping.conversation import Conversation, function_tool, tool_choice_fields, whole_calls
from gateway.mapping.inputs import BadRequest, parse_body, prompt_document
from gateway.mapping.logprobs import chat_logprobs
from gateway.mapping.protocol import Parsed, Protocol, Upstream, kind, serve
from gateway.protocols.ollama_models import error, generating_model, ollama_models_router, timestamp
from gateway.protocols.ollama_options import (
    CHAT_FIELDS,
    GENERATE_FIELDS,
    ChatRequest,
    GenerateRequest,
    OllamaRequest,
    format_fields,
    keep_alive_field,
    option_fields,
    think_fields,
)
from schemas import ModelOutputDocument, PromptDocument

SENT_AS = {"max_tokens": "num_predict", "repetition_penalty": "repeat_penalty", "json_schema": "format",
           "json_object": "format", "stop": "stop", "tools": "tools"}  # the engine's names -> Ollama's


def line(obj: dict) -> str:
    return json.dumps(obj, ensure_ascii=False) + "\n"


@dataclass
class OllamaContext:
    req: Any
    name: str  # the model as the request named it: every line echoes it
    started_ns: int = field(default_factory=time.perf_counter_ns)
    first_ns: Optional[int] = None


class Ollama(Protocol):
    """What chat and generate share: the mapping of options, the lines, errors as {"error"}."""

    media_type = "application/x-ndjson"
    request_model: type[OllamaRequest] = OllamaRequest

    async def parse(self, request: Request, backend: Upstream) -> Parsed:
        req = await parse_body(request, self.request_model)
        info = check(req, await backend.models())
        fields, num_ctx = option_fields(req.options, info)
        if req.top_logprobs and not req.logprobs:
            raise BadRequest("top_logprobs: needs logprobs: true", "top_logprobs")
        fields.update(format_fields(req.format), logprobs=bool(req.logprobs), top_logprobs=req.top_logprobs or 0,
                      keep_alive=keep_alive_field(req.keep_alive), **think_fields(req.think))
        doc = prompt_document(**self.prompt(req, info), **fields, model=info.model_id)
        if num_ctx is not None:
            doc = await _within(doc, num_ctx, backend)
        return Parsed(doc, req.stream is not False, OllamaContext(req, req.model or ""), dict(SENT_AS))

    def prompt(self, req: Any, info: ServerInfo) -> dict[str, Any]:
        """The document's prompt fields: messages (and tools), or a prompt."""
        raise NotImplementedError

    def refusal(self, error_: ModelOutputDocument) -> Response:
        return error(error_.error or "", kind(error_))

    def chunk(self, context: OllamaContext, text: str, **extra: Any) -> dict[str, Any]:
        raise NotImplementedError

    def final(self, context: OllamaContext, last: ModelOutputDocument, end_ns: int, text: str = "",
              **extra: Any) -> dict[str, Any]:
        first = context.first_ns or end_ns
        load_ns = round((last.load_seconds or 0.0) * 1e9)  # it waited so long for the model to load
        return {**self.chunk(context, text, **extra), "done": True,
                "done_reason": "length" if last.finish_reason == "length" else "stop",
                "total_duration": end_ns - context.started_ns, "load_duration": load_ns,
                "prompt_eval_count": last.prompt_tokens or 0,
                "prompt_eval_duration": max(0, first - context.started_ns - load_ns),
                "eval_count": last.generated_tokens or 0, "eval_duration": end_ns - first}

    async def events(self, parsed: Parsed, docs: AsyncIterator[ModelOutputDocument],
                     info: Optional[ServerInfo]) -> AsyncIterator[str]:
        context: OllamaContext = parsed.request
        with_calls: list[ModelOutputDocument] = []
        async for out in docs:
            context.first_ns = context.first_ns or time.perf_counter_ns()
            if out.error is not None:
                yield line({"error": out.error})
                return
            if out.tool_call_indexes:
                with_calls.append(out)
            if out.text or out.reasoning or (context.req.logprobs and out.token_ids):
                yield line(self.chunk(context, out.text, **_thinking(out.reasoning), **_logprobs(context, [out])))
            if out.finish_reason is not None:
                if with_calls:
                    yield line(self.chunk(context, "", tool_calls=ollama_calls(with_calls)))
                yield line(self.final(context, out, time.perf_counter_ns()))

    def answer(self, parsed: Parsed, result: CollectedAnswer, info: Optional[ServerInfo]) -> Response:
        context: OllamaContext = parsed.request
        context.first_ns = result.first_ns
        calls = {"tool_calls": ollama_calls(result.docs)} if whole_calls(result.docs) else {}
        last = result.last or ModelOutputDocument()
        thinking = _thinking("".join(d.reasoning for d in result.docs))
        return JSONResponse(self.final(context, last, time.perf_counter_ns(), result.text,
                                       **calls, **thinking, **_logprobs(context, result.docs)))


def check(req: OllamaRequest, models: list[ServerInfo]) -> ServerInfo:
    """The request's fields against their declaration, its keep_alive, and the model it names."""
    (CHAT_FIELDS if isinstance(req, ChatRequest) else GENERATE_FIELDS).check(req)
    keep_alive_field(req.keep_alive)
    return generating_model(req.model, models)


def _thinking(text: str) -> dict[str, Any]:
    """A reasoning model's thoughts, apart from the answer (Ollama's `thinking`); none: no key."""
    return {"thinking": text} if text else {}


def _logprobs(context: OllamaContext, docs: list[ModelOutputDocument]) -> dict[str, Any]:
    return {"logprobs": chat_logprobs(docs)["content"]} if context.req.logprobs else {}


def ollama_calls(docs: list[ModelOutputDocument]) -> list[dict[str, Any]]:
    """An answer's calls as Ollama gives them: each function's arguments as an object."""
    return [{"function": {"index": i, "name": c["function"]["name"],
                          "arguments": json.loads(c["function"]["arguments"] or "{}")}}
            for i, c in enumerate(whole_calls(docs))]


async def _within(doc: PromptDocument, num_ctx: int, backend: Upstream) -> PromptDocument:
    """num_ctx below the model's context: the prompt must fit, and the answer gets what is left."""
    tokens = await backend.tokenize(doc)
    if tokens.error is not None:
        raise BadRequest(tokens.error, tokens.error_field)
    left = num_ctx - len(tokens.token_ids)
    if left < 1:
        raise BadRequest(f"num_ctx: the prompt takes {len(tokens.token_ids)} tokens, num_ctx is {num_ctx}", "num_ctx")
    return doc.model_copy(update={"max_tokens": min(doc.max_tokens, left)})


class OllamaChat(Ollama):
    request_model = ChatRequest

    def prompt(self, req: Any, info: ServerInfo) -> dict[str, Any]:
        return {"messages": conversation(req.messages or []), **tool_choice_fields(_tools(req.tools), None, None)}

    def chunk(self, context: OllamaContext, text: str, **extra: Any) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if "thinking" in extra:
            message["thinking"] = extra.pop("thinking")
        if "tool_calls" in extra:
            message["tool_calls"] = extra.pop("tool_calls")
        return {"model": context.name, "created_at": timestamp(), "message": message, "done": False, **extra}


def _tools(tools: Optional[list[Any]]) -> list[dict[str, Any]]:
    """Ollama's tools (OpenAI's shape) as the contract takes them."""
    declared = []
    for i, tool in enumerate(tools or []):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict):
            raise BadRequest(f"tools.{i}.function: required, an object", "tools")
        declared.append(function_tool(function.get("name"), function.get("description"), function.get("parameters"),
                                      f"tools.{i}"))
    return declared


MESSAGE_KEYS = {"role", "content", "images", "thinking", "tool_calls", "tool_name", "tool_call_id"}


def conversation(messages: list[Any]) -> list[dict[str, Any]]:
    """Ollama's messages as the engine's conversation: system, user, assistant (with its calls)
    and tool turns, text only."""
    talk = Conversation()
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise BadRequest(f"messages.{i}: must be an object", "messages")
        role, content = m.get("role"), m.get("content") or ""
        unknown = set(m) - MESSAGE_KEYS
        if unknown:
            raise BadRequest(f"messages.{i}.{sorted(unknown)[0]}: not a message field this server knows", "messages")
        if not isinstance(content, str):
            raise BadRequest(f"messages.{i}.content: must be a string", "messages")
        if m.get("images"):
            raise BadRequest(f"messages.{i}.images: not served here (the model reads text)", "messages")
        # an assistant turn's `thinking` goes no further: reasoning models' templates drop past thoughts
        if role == "system":
            talk.system(content)
        elif role == "user":
            talk.user(content)
        elif role == "assistant":
            talk.assistant(content, _calls(m.get("tool_calls") or [], i))
        elif role == "tool":
            talk.tool_result(str(m.get("tool_call_id") or m.get("tool_name") or ""), content)
        else:
            raise BadRequest(f"messages.{i}.role: must be system, user, assistant or tool, got {role!r}", "messages")
    return talk.messages


def _calls(calls: list[Any], i: int) -> list[tuple[str, str, Any]]:
    """An assistant turn's calls, as (id, name, arguments); Ollama's clients may send no id."""
    out = []
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise BadRequest(f"messages.{i}.tool_calls.{j}.function.name: required, a string", "messages")
        out.append((str(call.get("id") or f"call_{i}_{j}"), function["name"], function.get("arguments") or {}))
    return out


class OllamaGenerate(Ollama):
    request_model = GenerateRequest

    def prompt(self, req: Any, info: ServerInfo) -> dict[str, Any]:
        if req.raw or not info.chat_template:
            if req.system:
                raise BadRequest("system: needs the model's chat template, which " + (
                    "raw: true leaves out" if req.raw else "this model does not have"), "system")
            return {"prompt": req.prompt or ""}
        talk = Conversation()
        talk.system(req.system or "")
        talk.user(req.prompt or "")
        return {"messages": talk.messages}

    def chunk(self, context: OllamaContext, text: str, **extra: Any) -> dict[str, Any]:
        return {"model": context.name, "created_at": timestamp(), "response": text, "done": False, **extra}


async def _loaded(request: Request, backend: Upstream, protocol: Ollama) -> Optional[Response]:
    """The answer to a request that only loads its model (no messages, an empty prompt), or with
    keep_alive 0 unloads it (`ollama stop`); None for any other, or one that does not parse
    (serve refuses it, naming the field)."""
    try:
        req = await parse_body(request, protocol.request_model)
        if (req.messages if isinstance(req, ChatRequest) else getattr(req, "prompt", None)):
            return None
        info = check(req, await backend.models())
        keep_alive = keep_alive_field(req.keep_alive)
    except BadRequest:
        return None
    out = await backend.keep_alive(info.model_id, keep_alive)
    if out.error is not None:
        return protocol.refusal(out)
    context = OllamaContext(req, req.model or "")
    done_reason = "unload" if keep_alive == 0 else "load"
    return JSONResponse({**protocol.chunk(context, ""), "done": True, "done_reason": done_reason})


def ollama_router(backend: Upstream) -> APIRouter:
    router = APIRouter(tags=["Ollama"])
    router.include_router(ollama_models_router(backend))

    @router.post("/api/chat", summary="Ollama: a chat answer, streamed as NDJSON unless stream is false")
    async def chat(request: Request) -> Response:
        protocol = OllamaChat()
        return await _loaded(request, backend, protocol) or await serve(protocol, backend, request)

    @router.post("/api/generate", summary="Ollama: a completion, streamed as NDJSON unless stream is false")
    async def generate(request: Request) -> Response:
        protocol = OllamaGenerate()
        return await _loaded(request, backend, protocol) or await serve(protocol, backend, request)

    return router
