"""WebSocket chat at /chat, and the browser page that uses it at GET /chat-ui.

Protocol (JSON text frames):
  client -> {"prompt": "...", <any PromptDocument sampling field>} or plain text (the prompt);
            {"type": "stop"} cancels the answer in progress; {"type": "reset"} forgets the
            conversation; {"type": "history", "messages": [{"role": ..., "content": ...}, ...]}
            replaces it (a page that keeps its conversations itself: one reloaded, edited or
            branched); {"type": "resume", "last_event_id": "<id>"} (on a new connection, after
            a dropped one) goes on with the answer from the event after that id, and with its
            conversation.
  server -> {"type": "token", "text": ..., "token_id": ..., "token_ids": [...]} per step (and
            "tool_calls": [...], OpenAI's delta parts, when the step carries calls; "reasoning": a
            reasoning model's thoughts of the step, apart from "text"; "logprobs":
            [...], OpenAI chat's logprobs.content, when logprobs or top_logprobs was asked),
            then {"type": "end", "finish_reason": ..., "prompt_tokens": ..., "cached_tokens": ...
            (of the prompt, reused from the prefix cache), "generated_tokens": ...,
            "seed": ... (the seed used when sampling, else null), and "tool_calls": [...] (OpenAI's) when
            the answer called tools};
            a stopped answer ends with finish_reason "cancelled";
            {"type": "error", "error": ..., "error_type": ...} on failure (the socket stays open).
            An answer's token and end events carry an "id", `<stream>/<n>`.
The connection keeps the conversation: each prompt goes to the executor as chat messages
with the earlier turns; the engine drops the oldest turns when they no longer fit the
context. A failed turn is not remembered; a stopped one is, with the text sent so far.

An answer's events are kept as an SSE stream's are (gateway/edge/resumable.py, within its
bounds): when the socket drops, the generation stops; a `resume` on a new socket replays the
events after the id it names and the rest of the answer, made from the tokens already sent.
"""
import asyncio
import json
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, Optional

from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from contract import RequestLimits, request_fields
from gateway.edge.backend import Backend
from gateway.edge.http_guard import api_key, key_matches, origin_allowed
from gateway.edge.resumable import ResumableDocs, StoredStream, streams, with_seed
from gateway.mapping.api_fields import ApiFields, served
from gateway.mapping.inputs import BadRequest, check_text, prompt_document
from gateway.mapping.logprobs import chat_logprobs
from gateway.mapping.tool_calls import parts, whole_calls
from gateway.protocols.chat_page import page_router
from schemas import PromptDocument

ROUTE = "/chat"

# a prompt message: the prompt and any request field (a command's own fields are read apart)
FIELDS = ApiFields("the WebSocket chat's messages", served("prompt", "type", *(f.name for f in request_fields())))
# a chat turn is one answer to the conversation: fields the chat cannot show are refused
ONE_ANSWER = {"n": 1, "prompt_logprobs": False}
MAX_HISTORY_MESSAGES = 200  # the gateway's own bound; the engine trims to the context


@dataclass(frozen=True)
class ChatTurn:
    """What an answer's kept stream holds beside its events: the conversation it answers, so
    that the socket that resumes it goes on with that conversation."""

    history: list[dict[str, Any]]
    turn: dict[str, str]


ROLES = ("system", "user", "assistant")


def _history(messages: Any) -> list[dict[str, str]]:
    """A conversation the client sends: raises ValueError naming `messages` where it is not one."""
    if not isinstance(messages, list) or len(messages) > MAX_HISTORY_MESSAGES:
        raise ValueError(f"messages: a list of at most {MAX_HISTORY_MESSAGES} {{role, content}} messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or set(m) != {"role", "content"} or m["role"] not in ROLES \
                or not isinstance(m["content"], str):
            raise ValueError(f"messages[{i}]: expected {{\"role\": one of {', '.join(ROLES)}, "
                             f"\"content\": a string}}")
    return [dict(m) for m in messages]


def _labelled(event_id: str, frame: str) -> str:
    return json.dumps({**json.loads(frame), "id": event_id}, ensure_ascii=False)


def _cancelled(stored: StoredStream) -> str:
    """The end event of a stopped answer."""
    return json.dumps({"type": "end", "finish_reason": "cancelled", "prompt_tokens": None,
                       "generated_tokens": len(stored.docs.tokens)})


async def _events(doc: PromptDocument, docs: ResumableDocs) -> Any:
    """An answer's events (JSON text): a token event per document, then its end or error."""
    kept = []
    async for out in docs:
        if out.error is not None:
            yield json.dumps({"type": "error", "error": out.error, "error_type": out.error_type or "generation"})
            return
        kept.append(out)
        event = {"type": "token", "text": out.text, "token_id": out.token_id, "token_ids": list(out.token_ids),
                 **({"tool_calls": calls} if (calls := parts(out)) else {}),
                 **({"reasoning": out.reasoning} if out.reasoning else {})}
        if doc.logprobs or doc.top_logprobs:
            event["logprobs"] = chat_logprobs([out])["content"]
        yield json.dumps(event, ensure_ascii=False)
        if out.finish_reason is not None:
            yield json.dumps({"type": "end", "finish_reason": out.finish_reason, "prompt_tokens": out.prompt_tokens,
                              "cached_tokens": out.cached_tokens, "generated_tokens": out.generated_tokens,
                              "seed": out.seed, **({"tool_calls": calls} if (calls := whole_calls(kept)) else {})},
                             ensure_ascii=False)
            return


class ChatSession:
    """One WebSocket: the conversation so far, and at most one answer in progress."""

    def __init__(self, ws: WebSocket, backend: Backend):
        self.ws, self.backend = ws, backend
        self.history: list[dict[str, Any]] = []
        self.limits = RequestLimits.from_env()
        self.task: Optional[asyncio.Task] = None
        self.stream: Optional[StoredStream] = None  # the answer in progress, once it started
        self._send_lock = asyncio.Lock()

    async def send(self, message: dict[str, Any] | str) -> None:
        async with self._send_lock:
            await self.ws.send_text(message if isinstance(message, str) else json.dumps(message, ensure_ascii=False))

    async def error(self, message: str, error_type: str = "validation") -> None:
        await self.send({"type": "error", "error": message, "error_type": error_type})

    def parse(self, raw: str) -> tuple[Optional[str], dict[str, Any]]:
        """(command or None, fields); raises ValueError with a message for the client."""
        try:
            data = json.loads(raw)
        except json.JSONDecodeError:
            data = None
        except RecursionError:
            raise ValueError("message: JSON nested too deeply") from None
        if not isinstance(data, dict):
            return None, {"prompt": raw}
        if data.get("type") in ("stop", "reset"):
            return data["type"], {}
        if data.get("type") == "history":
            return "history", {"messages": _history(data.get("messages"))}
        if data.get("type") == "resume":
            if not isinstance(data.get("last_event_id"), str):
                raise ValueError("last_event_id: a resume names the id of the last event received, a string")
            return "resume", {"last_event_id": data["last_event_id"]}
        FIELDS.check_names(sorted(data))  # a BadRequest, which is a ValueError
        if not isinstance(data.get("prompt"), str):
            raise ValueError("prompt: must be a string")
        for name, only in ONE_ANSWER.items():
            if data.get(name, only) != only:
                raise ValueError(f"{name}: the chat answers each turn once, without prompt scores; "
                                 f"use the OpenAI or gRPC routes")
        return None, {k: v for k, v in data.items() if k != "type"}

    async def handle(self, raw: str) -> None:
        try:
            command, fields = self.parse(raw)
        except ValueError as exc:
            return await self.error(str(exc))
        running = self.task if self.task is not None and not self.task.done() else None
        if command == "stop":
            if running is not None and self.stream is not None:
                await streams().cancel(self.stream)  # its events end with a cancelled end event
            elif running is not None:
                running.cancel()  # before its first token
            return
        if command == "reset":
            self.history.clear()
            return
        if running is not None:
            return await self.error("an answer is in progress: wait for its end or send {\"type\": \"stop\"}")
        if command == "resume":
            return await self.resume(fields["last_event_id"])
        if command == "history":
            self.history = fields["messages"]
            return
        prompt = fields.pop("prompt")
        if not prompt.strip():
            return await self.error("prompt: must be a non-empty string")
        try:
            check_text({"prompt": prompt, **fields})
        except BadRequest as exc:
            return await self.error(str(exc))
        turn = {"role": "user", "content": prompt}
        try:
            doc = prompt_document(messages=self.history + [turn], **fields)
        except BadRequest as exc:
            return await self.error(str(exc))
        self.task = asyncio.create_task(self.answer(doc, turn))

    async def answer(self, doc: PromptDocument, turn: dict[str, str]) -> None:
        docs = ResumableDocs(self.backend.open, with_seed(doc))
        try:
            await docs.start()
        except asyncio.CancelledError:  # stopped, or the socket closed, before the first token
            await docs.close()
            self.task = None
            await self._send_last({"type": "end", "finish_reason": "cancelled", "prompt_tokens": None,
                                   "generated_tokens": 0})
            raise
        self.stream = streams().start(ROUTE, docs, _events(doc, docs), label=_labelled, on_cancel=_cancelled,
                                      context=ChatTurn(list(self.history), turn))
        await self.relay(self.stream, 0)

    async def resume(self, last_event_id: str) -> None:
        found = streams().find(ROUTE, last_event_id)
        if found is None:
            return await self.error(f"last_event_id: {last_event_id!r} names no answer kept here (they are kept "
                                    f"LLM_RESUME_SECONDS after their socket closed)", "not_found")
        self.stream, start = found
        self.history = list(self.stream.context.history)
        self.task = asyncio.create_task(self.relay(self.stream, start))

    async def relay(self, stored: StoredStream, start: int) -> None:
        """Send the answer's events from `start`. Before its last one, keep the turn (a failed one
        is not kept) and go idle: a stop or prompt sent after it is about the next answer."""
        async with aclosing(streams().read(stored, start)) as frames:
            async for frame in frames:
                event = json.loads(frame)
                if event["type"] == "token":
                    await self.send(frame)
                    continue
                if event["type"] == "end":
                    context: ChatTurn = stored.context
                    self.history = list(context.history)
                    self.remember(context.turn, stored.docs.text, event.get("tool_calls"))
                self.task = self.stream = None
                await self._send_last(frame)

    async def _send_last(self, frame: dict[str, Any] | str) -> None:
        try:
            await asyncio.shield(self.send(frame))
        except Exception:  # noqa: BLE001 - the socket is gone
            pass

    def remember(self, turn: dict[str, str], answer: str, calls: Optional[list[dict]] = None) -> None:
        self.history += [turn, {"role": "assistant", "content": answer, **({"tool_calls": calls} if calls else {})}]
        del self.history[:-MAX_HISTORY_MESSAGES]

    async def run(self) -> None:
        try:
            while True:
                message = await self.ws.receive()
                if message["type"] == "websocket.disconnect":
                    break
                if message.get("text") is None:
                    await self.error("message: send text frames (JSON or the prompt), not binary")
                elif len(message["text"]) > self.limits.max_body_bytes:
                    await self.error(f"message: larger than {self.limits.max_body_bytes} characters "
                                     f"(LLM_MAX_BODY_BYTES)")
                else:
                    await self.handle(message["text"])
        except WebSocketDisconnect:
            pass
        finally:
            if self.task is not None and not self.task.done():
                self.task.cancel()  # the client left: its generation is aborted
                await asyncio.gather(self.task, return_exceptions=True)


def chat_router(backend: Backend) -> APIRouter:
    router = APIRouter(tags=["Chat"])

    @router.websocket("/chat")
    async def chat(ws: WebSocket) -> None:
        if not origin_allowed(ws.headers.get("origin"), ws.headers.get("host")):
            # a page on another site may not drive this service (see LLM_CORS_ORIGINS)
            await ws.close(code=1008, reason="origin: not allowed; see LLM_CORS_ORIGINS")
            return
        key = api_key()
        if key and not (key_matches(ws.headers.get("authorization"), key)
                        or key_matches(ws.query_params.get("api_key"), key)):
            await ws.close(code=1008, reason="authorization: a valid API key is required")
            return
        await ws.accept()
        await ChatSession(ws, backend).run()

    router.include_router(page_router(backend))
    return router
