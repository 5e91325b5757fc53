"""Anthropic's Messages API: POST /v1/messages (streaming with `stream: true`) and
POST /v1/messages/count_tokens, for the anthropic SDK and what is built on it (Claude Code, the
agent SDKs, LangChain's ChatAnthropic, pydantic-ai, LiteLLM).

A request maps onto the contract like every other route: `system` and `messages` (text,
`tool_use` and `tool_result` blocks) become the engine's conversation, `tools` and `tool_choice`
its function tools, `max_tokens`, `stop_sequences`, `temperature`, `top_p`, `top_k` its fields.
Anthropic samples at temperature 1 unless told otherwise, as here. What is not served is refused
naming the field (FIELDS, which docs/api.md's table follows): image and document blocks, server
tools, a final assistant message
(prefill), `container`, `mcp_servers`. `output_config.format` (a JSON schema) is structured output.
A reasoning model's thoughts come as `thinking` blocks before the answer's; `thinking` (enabled
with `budget_tokens`, or disabled) and `output_config.effort` bound them; an assistant turn's
thinking blocks go no further (reasoning models' templates drop past thoughts).
`cache_control` marks are accepted and do nothing: the prefix cache is automatic
(`usage.cache_read_input_tokens` says what it held); `metadata` and the other fields that name who
asks do not change an answer. A field that FIELDS does not name is refused.
"""
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, StrictInt, StrictStr

from contract import ErrorKind, ServerInfo
from contract.transport import ANTHROPIC_ERROR_TYPE, ANTHROPIC_STATUS
from gateway.edge.backend import CollectedAnswer
from gateway.mapping.api_fields import ApiFields, no_effect, refused, served
from gateway.mapping.conversation import (
    Conversation,
    StreamedCalls,
    function_tool,
    tool_choice_fields,
    usage_of,
    whole_calls,
)
from gateway.mapping.inputs import BadRequest, Number, parse_body, prompt_document, stop_list
from gateway.mapping.policies import effort_budget
from gateway.mapping.protocol import Parsed, Protocol, Upstream, kind, serve, sse
from schemas import ModelOutputDocument

STOP_REASON = {"eos_token": "end_turn", "length": "max_tokens", "stop_sequence": "stop_sequence",
               "tool_calls": "tool_use"}
TOOL_CHOICE = {"auto": "auto", "any": "required", "none": "none"}  # and {"type": "tool", "name"}
# every top-level field of a Messages request (docs/api.md's table is checked against it)
FIELDS = ApiFields("Anthropic's Messages API", (
    *served("model", "max_tokens", "messages", "system", "stop_sequences", "stream", "temperature", "top_p",
            "top_k", "tools", "tool_choice", "output_config", "thinking"),
    *no_effect("metadata", "cache_control", "service_tier", "inference_geo", "user_profile_id", "workspace_id"),
    refused("speed", "standard"), refused("container"),
    refused("mcp_servers", []), refused("context_management"), refused("diagnostics")))


class CountRequest(BaseModel):
    """POST /v1/messages/count_tokens: what shapes the prompt (a Messages request's other fields
    are accepted, as their extras, and do not change the count)."""
    model_config = ConfigDict(extra="allow")
    model: Optional[StrictStr] = None
    messages: list[dict[str, Any]]
    system: Optional[Union[StrictStr, list[dict[str, Any]]]] = None
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Optional[dict[str, Any]] = None
    output_config: Optional[dict[str, Any]] = None
    thinking: Optional[dict[str, Any]] = None
    metadata: Optional[dict[str, Any]] = None
    cache_control: Optional[dict[str, Any]] = None
    service_tier: Optional[StrictStr] = None
    inference_geo: Optional[StrictStr] = None
    user_profile_id: Optional[StrictStr] = None
    workspace_id: Optional[StrictStr] = None


class MessagesRequest(CountRequest):
    max_tokens: StrictInt
    stop_sequences: Optional[list[StrictStr]] = None
    stream: Optional[bool] = False
    temperature: Number = None
    top_p: Number = None
    top_k: Optional[StrictInt] = None


def error_body(message: str, error_kind: ErrorKind) -> dict:
    return {"type": "error", "error": {"type": ANTHROPIC_ERROR_TYPE[error_kind], "message": message}}


def _text(blocks: Any, where: str) -> str:
    """Text, or text blocks joined (a tool result's content, a system prompt)."""
    if isinstance(blocks, str):
        return blocks
    if not isinstance(blocks, list):
        raise BadRequest(f"{where}: must be a string or a list of content blocks", where.split(".")[0])
    texts = []
    for i, block in enumerate(blocks):
        if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
            raise BadRequest(f"{where}.{i}: only text blocks are served here", where.split(".")[0])
        texts.append(block["text"])
    return "\n".join(texts)


def conversation(req: Any) -> list[dict[str, Any]]:
    """`system` and `messages` as the engine's conversation."""
    talk = Conversation()
    if req.system is not None:
        talk.system(_text(req.system, "system"))
    for i, message in enumerate(req.messages):
        role, content = message.get("role"), message.get("content")
        where = f"messages.{i}.content"
        if role not in ("user", "assistant"):
            raise BadRequest(f"messages.{i}.role: must be user or assistant", "messages")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not isinstance(blocks, list):
            raise BadRequest(f"{where}: must be a string or a list of content blocks", "messages")
        _turn(talk, role, blocks, where)
    if req.messages and req.messages[-1].get("role") == "assistant":
        raise BadRequest(f"messages.{len(req.messages) - 1}: an answer begun by a final assistant message "
                         "(prefill) is not served here; end with a user message", "messages")
    return talk.messages


def _turn(talk: Conversation, role: str, blocks: list[Any], where: str) -> None:
    text, calls = [], []
    for j, block in enumerate(blocks):
        kind_ = block.get("type") if isinstance(block, dict) else None
        if kind_ == "text" and isinstance(block.get("text"), str):
            text.append(block["text"])
        elif kind_ == "tool_use" and role == "assistant":
            calls.append((str(block.get("id", "")), block.get("name"), block.get("input") or {}))
        elif kind_ in ("thinking", "redacted_thinking") and role == "assistant":
            pass  # past thoughts go no further, as reasoning models' templates drop them
        elif kind_ == "tool_result" and role == "user":
            result = _text(block.get("content") or "", f"{where}.{j}.content")
            talk.tool_result(str(block.get("tool_use_id", "")), ("Error: " if block.get("is_error") else "") + result)
        else:
            raise BadRequest(f"{where}.{j}: a {kind_} block is not served here (text, tool_use, tool_result)",
                             "messages")
    if role == "assistant":
        talk.assistant("".join(text), calls)
    elif text:
        talk.user("".join(text))


def tools(req: Any) -> dict[str, Any]:
    """`tools` (custom tools: name, description, input_schema) and `tool_choice`."""
    declared = []
    for i, tool in enumerate(req.tools or []):
        if not isinstance(tool, dict) or tool.get("type", "custom") != "custom":
            raise BadRequest(f"tools.{i}: server tools ({tool.get('type') if isinstance(tool, dict) else tool}) "
                             f"are not served here; custom tools are", "tools")
        declared.append(function_tool(tool.get("name"), tool.get("description"), tool.get("input_schema"),
                                      f"tools.{i}"))
    choice = req.tool_choice or {}
    kind_ = choice.get("type")
    if kind_ is not None and kind_ not in (*TOOL_CHOICE, "tool"):
        raise BadRequest("tool_choice.type: must be auto, any, tool or none", "tool_choice")
    name = choice.get("name") if kind_ == "tool" else TOOL_CHOICE.get(kind_) if kind_ else None
    parallel = None if choice.get("disable_parallel_tool_use") is None else not choice["disable_parallel_tool_use"]
    return tool_choice_fields(declared, name, parallel)


def output_format(config: Optional[dict[str, Any]]) -> dict[str, Any]:
    """`output_config.format` ({"type": "json_schema", "schema"}: structured output), and its
    `effort` (how long a reasoning model thinks: OpenAI's efforts' budgets)."""
    config = config or {}
    budget = effort_budget(config.get("effort"), "output_config.effort", "output_config")
    fmt = config.get("format")
    if fmt is None:
        return budget
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
        raise BadRequest('output_config.format: must be {"type": "json_schema", "schema": {...}}', "output_config")
    return {**budget, "json_schema": json.dumps(fmt["schema"])}


def thinking(config: Optional[dict[str, Any]]) -> dict[str, Any]:
    """`thinking`: enabled with `budget_tokens` (the thoughts' budget), disabled (none), or
    adaptive (as the model goes)."""
    if config is None:
        return {}
    kind_ = config.get("type")
    if kind_ == "disabled":
        return {"reasoning_budget": 0}
    if kind_ == "adaptive":
        return {}
    budget = config.get("budget_tokens")
    if kind_ != "enabled" or not isinstance(budget, int) or isinstance(budget, bool) or budget < 0:
        raise BadRequest('thinking: {"type": "enabled", "budget_tokens": N}, {"type": "disabled"} or '
                         '{"type": "adaptive"}', "thinking")
    return {"reasoning_budget": budget}


def to_fields(req: Any) -> dict[str, Any]:
    FIELDS.check(req)
    fields = {"model": req.model, "max_tokens": req.max_tokens, "stop": stop_list(req.stop_sequences),
              "do_sample": True, **tools(req), **output_format(req.output_config), **thinking(req.thinking)}
    for name in ("temperature", "top_p", "top_k"):
        if getattr(req, name) is not None:
            fields[name] = getattr(req, name)
    return fields


@dataclass
class MessageContext:
    req: Any
    id: str = field(default_factory=lambda: "msg_" + uuid.uuid4().hex)


class Messages(Protocol):

    async def parse(self, request: Request, backend: Upstream) -> Parsed:
        req = await parse_body(request, MessagesRequest)
        doc = prompt_document(messages=conversation(req), **to_fields(req))
        return Parsed(doc, bool(req.stream), MessageContext(req), {"stop": "stop_sequences",
                                                                   "json_schema": "output_config"})

    def refusal(self, error: ModelOutputDocument) -> Response:
        k = kind(error)
        return JSONResponse(error_body(error.error or "", k), status_code=ANTHROPIC_STATUS[k])

    def message(self, parsed: Parsed, info: Optional[ServerInfo], content: list, stop: Optional[str],
                stop_sequence: Optional[str], usage: dict) -> dict:
        assert info is not None
        return {"id": parsed.request.id, "type": "message", "role": "assistant", "model": info.model_id,
                "content": content, "stop_reason": stop, "stop_sequence": stop_sequence, "usage": usage}

    def answer(self, parsed: Parsed, result: CollectedAnswer, info: Optional[ServerInfo]) -> Response:
        docs = result.docs
        last = result.last or ModelOutputDocument()
        text, thought = "".join(d.text for d in docs), "".join(d.reasoning for d in docs)
        content: list[dict] = [{"type": "thinking", "thinking": thought, "signature": ""}] if thought else []
        content += [{"type": "text", "text": text}] if text or not whole_calls(docs) else []
        content += [{"type": "tool_use", "id": c["id"], "name": c["function"]["name"],
                     "input": json.loads(c["function"]["arguments"] or "{}")} for c in whole_calls(docs)]
        return JSONResponse(self.message(parsed, info, content, STOP_REASON.get(last.finish_reason or ""),
                                         last.stop_sequence, _usage([last])))

    async def events(self, parsed: Parsed, docs: AsyncIterator[ModelOutputDocument],
                     info: Optional[ServerInfo]) -> AsyncIterator[str]:
        stream = _BlockStream()
        first = True
        async for out in docs:
            if first:
                first = False
                yield _event("message_start", {"message": self.message(parsed, info, [], None, None, _usage([out], 0))})
                yield _event("ping", {})
            if out.error is not None:
                yield _event("error", error_body(out.error, kind(out)))
                return
            for frame in stream.feed(out):
                yield frame
            if out.finish_reason is not None:
                for frame in stream.close():
                    yield frame
                yield _event("message_delta", {"delta": {"stop_reason": STOP_REASON.get(out.finish_reason),
                                                         "stop_sequence": out.stop_sequence}, "usage": _usage([out])})
                yield _event("message_stop", {})


def _event(name: str, data: dict) -> str:
    return sse({"type": name, **data}, event=name)


def _usage(finals: list[ModelOutputDocument], output: Optional[int] = None) -> dict:
    """Anthropic's usage: input tokens apart from those the prefix cache held (cache reads)."""
    prompt, cached, generated = usage_of(finals)
    return {"input_tokens": prompt - cached, "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached,
            "output_tokens": generated if output is None else output}


class _BlockStream:
    """An answer's content blocks as Anthropic streams them: a thinking block (a reasoning
    model's), a text block, then each tool_use block, each opened, fed its deltas, and closed
    before the next."""

    def __init__(self) -> None:
        self.index, self.open = -1, None  # the open block: "text" or a call's index
        self.calls = StreamedCalls()

    def feed(self, out: ModelOutputDocument) -> list[str]:
        frames = []
        if out.reasoning:
            if self.open != "thinking":
                frames += self._start({"type": "thinking", "thinking": "", "signature": ""}, "thinking")
            frames.append(self._delta({"type": "thinking_delta", "thinking": out.reasoning}))
        if out.text:
            if self.open != "text":
                frames += self._start({"type": "text", "text": ""}, "text")
            frames.append(self._delta({"type": "text_delta", "text": out.text}))
        for call, start, arguments in self.calls.feed(out):
            if start is not None:
                frames += self._start({"type": "tool_use", "id": start[0], "name": start[1], "input": {}}, call)
            if arguments:
                frames.append(self._delta({"type": "input_json_delta", "partial_json": arguments}))
        return frames

    def close(self) -> list[str]:
        if self.index < 0:  # an empty answer still has its (empty) text block
            return [*self._start({"type": "text", "text": ""}, "text"), *self.close_open()]
        return self.close_open()

    def close_open(self) -> list[str]:
        if self.open is None:
            return []
        self.open = None
        return [_event("content_block_stop", {"index": self.index})]

    def _start(self, block: dict, which: Any) -> list[str]:
        frames = self.close_open()
        self.index, self.open = self.index + 1, which
        return [*frames, _event("content_block_start", {"index": self.index, "content_block": block})]

    def _delta(self, delta: dict) -> str:
        return _event("content_block_delta", {"index": self.index, "delta": delta})


def anthropic_router(backend: Upstream) -> APIRouter:
    router = APIRouter(prefix="/v1", tags=["Anthropic"])

    @router.post("/messages", summary="Anthropic Messages (streaming with stream=true)")
    async def messages(request: Request) -> Response:
        return await serve(Messages(), backend, request)

    @router.post("/messages/count_tokens", summary="Anthropic: the tokens a Messages request's prompt takes")
    async def count_tokens(request: Request) -> Response:
        try:
            req = await parse_body(request, CountRequest)
            FIELDS.check(req)
            output_format(req.output_config)
            doc = prompt_document(messages=conversation(req), model=req.model, **tools(req))
        except BadRequest as exc:
            return JSONResponse(error_body(str(exc), ErrorKind.VALIDATION), status_code=400)
        out = await backend.tokenize(doc)
        if out.error is not None:
            return Messages().refusal(out)
        return JSONResponse({"input_tokens": len(out.token_ids)})

    return router
