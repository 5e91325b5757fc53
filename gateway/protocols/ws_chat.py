"""WebSocket chat at /chat, and the browser page that uses it at GET /chat-ui.

Protocol (JSON text frames):
  client -> {"prompt": "...", <any PromptDocument sampling field>} or plain text (the prompt);
            {"type": "stop"} cancels the answer in progress; {"type": "reset"} forgets the
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
The connection keeps the conversation: each prompt goes to the executor as chat messages
with the earlier turns; the engine drops the oldest turns when they no longer fit the
context. A failed turn is not remembered; a stopped one is, with the text sent so far.
"""
import asyncio
import json
from importlib import resources
from typing import Any, Optional

from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from fastapi.responses import HTMLResponse

from contract import RequestLimits, request_fields
from gateway.edge.backend import Backend, close_quietly
from gateway.edge.http_guard import api_key, key_matches, origin_allowed
from gateway.mapping.inputs import BadRequest, check_text, prompt_document
from gateway.mapping.logprobs import chat_logprobs
from gateway.mapping.tool_calls import parts, whole_calls
from schemas import PromptDocument

SAMPLING_FIELDS = tuple(f.name for f in request_fields())
# a chat turn is one answer to the conversation: fields the chat cannot show are refused
ONE_ANSWER = {"n": 1, "prompt_logprobs": False}
MAX_HISTORY_MESSAGES = 200  # the gateway's own bound; the engine trims to the context


class ChatSession:
    """One WebSocket: the conversation so far, and at most one answer in progress."""

    def __init__(self, ws: WebSocket, backend: Backend):
        self.ws, self.backend = ws, backend
        self.history: list[dict[str, Any]] = []
        self.limits = RequestLimits.from_env()
        self.task: Optional[asyncio.Task] = None
        self._send_lock = asyncio.Lock()

    async def send(self, message: dict[str, Any]) -> None:
        async with self._send_lock:
            await self.ws.send_text(json.dumps(message, ensure_ascii=False))

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
        unknown = sorted(set(data) - set(SAMPLING_FIELDS) - {"prompt", "type"})
        if unknown:
            raise ValueError(f"{unknown[0]}: unknown field; send prompt and any of {', '.join(SAMPLING_FIELDS)}")
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
            if running is not None:
                running.cancel()
            return
        if command == "reset":
            self.history.clear()
            return
        if running is not None:
            return await self.error("an answer is in progress: wait for its end or send {\"type\": \"stop\"}")
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
        text, generated, docs = "", 0, []
        final: dict[str, Any] = {"type": "end", "finish_reason": "cancelled", "prompt_tokens": None}
        stream = self.backend.stream(doc)
        try:
            async for out in stream:
                if out.error is not None:
                    final = {"type": "error", "error": out.error, "error_type": out.error_type or "generation"}
                    break
                text, generated = out.generated_text, out.index + 1
                docs.append(out)
                event = {"type": "token", "text": out.text, "token_id": out.token_id, "token_ids": list(out.token_ids),
                         **({"tool_calls": calls} if (calls := parts(out)) else {}),
                         **({"reasoning": out.reasoning} if out.reasoning else {})}
                if doc.logprobs or doc.top_logprobs:
                    event["logprobs"] = chat_logprobs([out])["content"]
                await self.send(event)
                if out.finish_reason is not None:
                    final = {"type": "end", "finish_reason": out.finish_reason,
                             "prompt_tokens": out.prompt_tokens, "cached_tokens": out.cached_tokens,
                             "generated_tokens": out.generated_tokens,
                             "seed": out.seed, **({"tool_calls": calls} if (calls := whole_calls(docs)) else {})}
                    break
        except asyncio.CancelledError:  # stop button, or the socket closed
            final["generated_tokens"] = generated
            await self._finish(stream, turn, text, final)
            raise
        finally:
            await close_quietly(stream)
        await self._finish(stream, turn, text, final)

    async def _finish(self, stream: Any, turn: dict[str, str], text: str, final: dict[str, Any]) -> None:
        """Close the upstream, keep the turn (a failed one is not kept) and go idle *before*
        the last event: a stop or prompt sent after it is about the next answer."""
        await close_quietly(stream)
        if final["type"] == "end":
            self.remember(turn, text, final.get("tool_calls"))
        self.task = None
        try:
            await asyncio.shield(self.send(final))
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
    page = resources.files("gateway").joinpath("static/chat.html").read_text(encoding="utf-8")

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

    @router.get("/chat-ui", response_class=HTMLResponse, summary="A small browser chat over /chat")
    async def chat_ui() -> HTMLResponse:
        return HTMLResponse(page)

    return router
