"""OpenAI's Responses API, stateless: POST /v1/responses (streaming with `stream: true`), for the
openai SDK's `responses`, the openai-agents SDK and Codex.

`input` (a string, or items: messages, `function_call` and `function_call_output`) and
`instructions` become the engine's conversation; `tools` (function tools) and `tool_choice` its
tools; `text.format` (json_schema, json_object) its structured output; `max_output_tokens`,
`temperature`, `top_p` its fields. `background: true` answers at once and generates on; such a
response is kept for GET, cancel and DELETE (responses_stored.py), and a later request may go on
from it with `previous_response_id`. Nothing else is kept: `store: true` without `background` is
refused naming the field (a client sends the conversation each time, as agents do with `store:
false`), and so are the other fields that would change an answer and are not served, and any
field that FIELDS (which docs/api.md's table follows) does not name.
"""
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, StrictBool, StrictInt, StrictStr

from contract import ServerInfo
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
from gateway.mapping.inputs import BadRequest, Number, parse_body, prompt_document
from gateway.mapping.policies import effort_budget, max_tokens_or_default
from gateway.mapping.protocol import Parsed, Protocol, Upstream, kind, serve, sse
from gateway.mapping.structured_output import response_format
from gateway.protocols.openai_routes import openai_refusal
from gateway.protocols.responses_stored import add_stored_routes, earlier_items
from schemas import ModelOutputDocument

# every top-level field of a Responses request (docs/api.md's table is checked against it)
FIELDS = ApiFields("OpenAI's Responses API", (
    *served("model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "tools", "tool_choice",
            "parallel_tool_calls", "text", "stream", "reasoning", "background", "store", "previous_response_id"),
    *no_effect("metadata", "user", "safety_identifier", "prompt_cache_key", "prompt_cache_retention",
               "prompt_cache_options", "stream_options"),
    refused("conversation"), refused("background_options"), refused("include", []),
    refused("prompt"),
    refused("max_tool_calls"), refused("top_logprobs", 0), refused("service_tier", "auto", "default"),
    refused("truncation", "auto"),  # the oldest turns are dropped to fit, always
    refused("context_management"), refused("moderation"), refused("image"), refused("access_programs")))
ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: Optional[StrictStr] = None
    input: Union[StrictStr, list[dict[str, Any]]]
    instructions: Optional[StrictStr] = None
    max_output_tokens: Optional[StrictInt] = None
    reasoning: Optional[dict[str, Any]] = None
    temperature: Number = None
    top_p: Number = None
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Optional[Union[StrictStr, dict[str, Any]]] = None
    parallel_tool_calls: Optional[StrictBool] = None
    text: Optional[dict[str, Any]] = None
    stream: Optional[bool] = False
    background: Optional[StrictBool] = None
    store: Optional[StrictBool] = None
    previous_response_id: Optional[StrictStr] = None
    metadata: Optional[dict[str, Any]] = None
    user: Optional[StrictStr] = None
    safety_identifier: Optional[StrictStr] = None
    prompt_cache_key: Optional[StrictStr] = None
    prompt_cache_retention: Optional[StrictStr] = None
    prompt_cache_options: Optional[dict[str, Any]] = None
    stream_options: Optional[dict[str, Any]] = None


def kept(req: Any) -> bool:
    """Whether the response is kept: `background: true` (with `store` true or unsaid, as OpenAI's
    default is); a response that is not in the background is not kept, so `store: true` alone is
    refused."""
    if req.background:
        if req.store is False:
            raise BadRequest("background: a background response is kept: it needs store true (or unsaid)", "background")
        return True
    if req.store:
        raise BadRequest("store: only background responses are kept here (background: true)", "store")
    return False


def input_items(req: Any) -> list[dict[str, Any]]:
    """The request's input as items, after those of the response it goes on from (its input and
    its output; not its instructions, as OpenAI's API has it)."""
    items = [{"role": "user", "content": req.input}] if isinstance(req.input, str) else list(req.input)
    return (earlier_items(req.previous_response_id) if req.previous_response_id is not None else []) + items


def conversation(instructions: Optional[str], items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    talk = Conversation()
    talk.system(instructions or "")
    pending: list[tuple[str, Any, Any]] = []  # an assistant's calls, joined into its turn
    for i, item in enumerate(items):
        kind_ = item.get("type", "message")
        if kind_ == "reasoning":  # past thoughts go no further, as reasoning models' templates drop them
            continue
        if kind_ == "function_call":
            pending.append((str(item.get("call_id", "")), item.get("name"), item.get("arguments") or "{}"))
            continue
        if pending:
            talk.assistant("", pending)
            pending = []
        if kind_ == "function_call_output":
            talk.tool_result(str(item.get("call_id", "")), _text(item.get("output", ""), f"input.{i}.output"))
        elif kind_ == "message" and item.get("role") in ROLES:
            _message(talk, ROLES[item["role"]], _text(item.get("content", ""), f"input.{i}.content"))
        else:
            raise BadRequest(f"input.{i}: a {kind_} item is not served here (message, function_call, "
                             f"function_call_output)", "input")
    if pending:
        talk.assistant("", pending)
    return talk.messages


def _message(talk: Conversation, role: str, text: str) -> None:
    if role == "system":
        talk.system(text)
    elif role == "assistant":
        talk.assistant(text)
    else:
        talk.user(text)


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content if isinstance(content, list) else [None]):
        if not isinstance(part, dict) or part.get("type") not in ("input_text", "output_text", "text"):
            raise BadRequest(f"{where}.{j}: only text parts are served here", where.split(".")[0])
        texts.append(str(part.get("text", "")))
    return "".join(texts)


def tools(req: Any) -> dict[str, Any]:
    declared = []
    for i, tool in enumerate(req.tools or []):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise BadRequest(f"tools.{i}: only function tools are served here, got "
                             f"{tool.get('type') if isinstance(tool, dict) else tool!r}", "tools")
        declared.append(function_tool(tool.get("name"), tool.get("description"), tool.get("parameters"),
                                      f"tools.{i}"))
    choice = req.tool_choice
    if isinstance(choice, dict):
        if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
            raise BadRequest('tool_choice: must be none, auto, required or {"type": "function", "name"}',
                             "tool_choice")
        choice = choice["name"]
    return tool_choice_fields(declared, choice, req.parallel_tool_calls)


def text_format(req: Any) -> dict[str, Any]:
    """`text.format` as chat's response_format (its json_schema inline); a `verbosity` other than
    the model's own (medium) is refused."""
    text = req.text or {}
    for key, value in text.items():
        if key not in ("format", "verbosity") or (key == "verbosity" and value not in (None, "medium")):
            raise BadRequest(f"text.{key}: {value!r} is not served here (text.format is)", "text")
    fmt = text.get("format")
    if fmt is None:
        return {}
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        fmt = {"type": "json_schema", "json_schema": {"schema": fmt.get("schema")}}
    try:
        return response_format(fmt)
    except BadRequest as exc:
        raise BadRequest(str(exc).replace("response_format", "text.format"), "text") from None


def reasoning(req: Any) -> dict[str, Any]:
    """`reasoning.effort` as a budget of thinking tokens; a `summary` of the thoughts is not made
    here (the thoughts themselves come, as a reasoning item)."""
    config = req.reasoning or {}
    for key, value in config.items():
        if key not in ("effort", "summary") or (key == "summary" and value is not None):
            raise BadRequest(f"reasoning.{key}: {value!r} is not served here (reasoning.effort is)", "reasoning")
    return effort_budget(config.get("effort"), "reasoning.effort", "reasoning")


@dataclass
class ResponseContext:
    req: Any
    items: list[dict[str, Any]]  # the conversation's items: earlier responses', then this input
    id: str = field(default_factory=lambda: "resp_" + uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))
    sequence: int = 0

    def next(self) -> int:
        self.sequence += 1
        return self.sequence - 1


class Responses(Protocol):
    """The request maps onto the contract; errors are OpenAI's."""

    async def parse(self, request: Request, backend: Upstream) -> Parsed:
        req = await parse_body(request, ResponsesRequest)
        FIELDS.check(req)
        max_tokens = await max_tokens_or_default(req.max_output_tokens, req.model, backend.info)
        fields = {"model": req.model, "max_tokens": max_tokens, **reasoning(req), "do_sample": True, **tools(req), **text_format(req)}
        fields.update({k: getattr(req, k) for k in ("temperature", "top_p") if getattr(req, k) is not None})
        sent_as = {"max_tokens": "max_output_tokens", "json_schema": "text", "json_object": "text"}
        background = kept(req)
        context = ResponseContext(req, input_items(req))
        return Parsed(prompt_document(messages=conversation(req.instructions, context.items), **fields),
                      bool(req.stream) or background,
                      context, sent_as, background=context.id if background else None)

    def refusal(self, error: ModelOutputDocument) -> Response:
        return openai_refusal(error)

    def accepted(self, parsed: Parsed, info: Optional[ServerInfo]) -> Optional[Response]:
        """A background response that is not streamed: the response as it starts, at once."""
        if parsed.request.req.stream:
            return None
        return JSONResponse(self.response(parsed, info, [], "in_progress", []))

    def response(self, parsed: Parsed, info: Optional[ServerInfo], output: list, status: str,
                 finals: list[ModelOutputDocument]) -> dict:
        assert info is not None
        context: ResponseContext = parsed.request
        req = context.req
        prompt, cached, generated = usage_of(finals)
        return {"id": context.id, "object": "response", "created_at": context.created, "status": status,
                "model": info.model_id, "output": output, "error": None,
                "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
                "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
                "parallel_tool_calls": req.parallel_tool_calls is not False, "previous_response_id": req.previous_response_id,
                "store": bool(req.background), "background": bool(req.background), "temperature": req.temperature, "top_p": req.top_p, "tool_choice": req.tool_choice or
                "auto", "tools": req.tools or [], "text": req.text or {"format": {"type": "text"}},
                "truncation": "auto", "metadata": req.metadata or {}, "user": req.user,
                "usage": None if not finals else {
                    "input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached},
                    "output_tokens": generated,
                    "output_tokens_details": {"reasoning_tokens": sum(d.reasoning_tokens or 0 for d in finals)},
                    "total_tokens": prompt + generated}}

    def answer(self, parsed: Parsed, result: CollectedAnswer, info: Optional[ServerInfo]) -> Response:
        docs, last = result.docs, result.last or ModelOutputDocument()
        output = _items("".join(d.text for d in docs), whole_calls(docs), "completed",
                        "".join(d.reasoning for d in docs))
        return JSONResponse(self.response(parsed, info, output, _status(last), [last]))

    async def events(self, parsed: Parsed, docs: AsyncIterator[ModelOutputDocument],
                     info: Optional[ServerInfo]) -> AsyncIterator[str]:
        context: ResponseContext = parsed.request
        stream = _ItemStream()
        yield self._event(context, "response.created", response=self.response(parsed, info, [], "in_progress", []))
        yield self._event(context, "response.in_progress", response=self.response(parsed, info, [], "in_progress", []))
        async for out in docs:
            if out.error is not None:
                yield self._event(context, "error", code=kind(out).value, message=out.error, param=out.error_field)
                return
            for name, fields in stream.feed(out):
                yield self._event(context, name, **fields)
            if out.finish_reason is not None:
                for name, fields in stream.close():
                    yield self._event(context, name, **fields)
                status = _status(out)
                final = self.response(parsed, info, stream.output, status, [out])
                yield self._event(context, f"response.{status}", response=final)

    @staticmethod
    def _event(context: ResponseContext, event: str, **fields: Any) -> str:
        return sse({"type": event, "sequence_number": context.next(), **fields}, event=event)


def _status(last: ModelOutputDocument) -> str:
    return "incomplete" if last.finish_reason == "length" else "completed"


def _items(text: str, calls: list[dict], status: str, thought: str = "") -> list[dict]:
    """An answer's output items: a reasoning model's thoughts, its message (when it has text or
    no call), then its calls."""
    items = [_reasoning_item("rs_" + uuid.uuid4().hex, thought, status)] if thought else []
    items += [_message_item("msg_" + uuid.uuid4().hex, text, status)] if text or not calls else []
    return items + [_call_item(c["id"], c["function"]["name"], c["function"]["arguments"], status) for c in calls]


def _reasoning_item(item_id: str, text: Optional[str], status: str) -> dict:
    content = [] if text is None else [{"type": "reasoning_text", "text": text}]
    return {"type": "reasoning", "id": item_id, "status": status, "summary": [], "content": content}


def _message_item(item_id: str, text: Optional[str], status: str) -> dict:
    content = [] if text is None else [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def _call_item(call_id: str, name: str, arguments: str, status: str) -> dict:
    return {"type": "function_call", "id": "fc_" + call_id.removeprefix("call_"), "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}


class _ItemStream:
    """An answer's output items as the Responses API streams them: each added, fed its deltas and
    done before the next."""

    def __init__(self) -> None:
        self.output: list[dict] = []
        self.open: Optional[dict] = None  # the item being streamed
        self.calls = StreamedCalls()

    def feed(self, out: ModelOutputDocument) -> list[tuple[str, dict]]:
        events: list[tuple[str, dict]] = []
        if out.reasoning:
            if self.open is None or self.open["type"] != "reasoning":
                events += self._add(_reasoning_item("rs_" + uuid.uuid4().hex, None, "in_progress"))
                self.open["text"] = ""  # type: ignore[index]
            self.open["text"] += out.reasoning  # type: ignore[index]
            events.append(("response.reasoning_text.delta", self._at(content_index=0, delta=out.reasoning)))
        if out.text:
            if self.open is None or self.open["type"] != "message":
                events += self._add(_message_item("msg_" + uuid.uuid4().hex, None, "in_progress"))
                events.append(("response.content_part.added", self._at(content_index=0, part={
                    "type": "output_text", "text": "", "annotations": [], "logprobs": []})))
                self.open["text"] = ""  # type: ignore[index]
            self.open["text"] += out.text  # type: ignore[index]
            events.append(("response.output_text.delta", self._at(content_index=0, delta=out.text, logprobs=[])))
        for _, start, arguments in self.calls.feed(out):
            if start is not None:
                events += self._add(_call_item(start[0], start[1], "", "in_progress"))
            if arguments:
                self.open["arguments"] += arguments  # type: ignore[index]
                events.append(("response.function_call_arguments.delta", self._at(delta=arguments)))
        return events

    def close(self) -> list[tuple[str, dict]]:
        if self.open is None and not self.output:  # an empty answer: its empty message
            return [*self._add(_message_item("msg_" + uuid.uuid4().hex, None, "in_progress")), *self._done()]
        return self._done()

    def _add(self, item: dict) -> list[tuple[str, dict]]:
        events = self._done()
        self.open = item
        return [*events, ("response.output_item.added", {"output_index": len(self.output), "item": dict(item)})]

    def _done(self) -> list[tuple[str, dict]]:
        item, self.open = self.open, None
        if item is None:
            return []
        events = []
        if item["type"] == "message":
            text = item.pop("text", "")
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
            events += [("response.output_text.done", self._for(item, content_index=0, text=text, logprobs=[])),
                       ("response.content_part.done", self._for(item, content_index=0, part=part))]
            item["content"] = [part]
        elif item["type"] == "reasoning":
            text = item.pop("text", "")
            events.append(("response.reasoning_text.done", self._for(item, content_index=0, text=text)))
            item["content"] = [{"type": "reasoning_text", "text": text}]
        else:
            events.append(("response.function_call_arguments.done",
                           self._for(item, arguments=item["arguments"], name=item["name"])))
        item["status"] = "completed"
        events.append(("response.output_item.done", {"output_index": len(self.output), "item": item}))
        self.output.append(item)
        return events

    def _at(self, **fields: Any) -> dict:
        assert self.open is not None
        return self._for(self.open, **fields)

    def _for(self, item: dict, **fields: Any) -> dict:
        return {"item_id": item["id"], "output_index": len(self.output), **fields}


def responses_router(backend: Upstream) -> APIRouter:
    router = APIRouter(prefix="/v1", tags=["OpenAI Responses"])

    @router.post("/responses", summary="OpenAI Responses (streaming with stream=true; kept with background=true)")
    async def responses(request: Request) -> Response:
        return await serve(Responses(), backend, request)

    add_stored_routes(router)
    return router

