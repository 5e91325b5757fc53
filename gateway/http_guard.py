"""What the HTTP port lets in: body size, cross-origin callers, debug pages.

Safe by default, opened deliberately with environment variables:
  LLM_MAX_BODY_BYTES  the largest request body (2 MB, TGI's), like every request limit
  LLM_CORS_ORIGINS    comma-separated origins that browsers may call from (and open the
                      WebSocket from), `*` for any; none by default: pages on other sites
                      cannot drive a service on your machine
  LLM_HTTP_DEBUG=1    serves /docs, /redoc, /openapi.json and Jina's /dry_run
"""
import json
import os
from collections.abc import Callable
from typing import Optional
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from executors.engine.limits import RequestLimits

DEBUG_PATHS = {"/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json", "/dry_run"}


def debug_enabled() -> bool:
    return os.environ.get("LLM_HTTP_DEBUG", "").lower() in ("1", "true", "yes")


def cors_origins() -> list[str]:
    return [o.strip().rstrip("/") for o in os.environ.get("LLM_CORS_ORIGINS", "").split(",") if o.strip()]


def origin_allowed(origin: Optional[str], host: Optional[str]) -> bool:
    """A browser's Origin: the page served by this port itself, or one of LLM_CORS_ORIGINS.
    Callers that are not browsers send no Origin and are let through."""
    if not origin:
        return True
    allowed = cors_origins()
    if "*" in allowed or origin.rstrip("/") in allowed:
        return True
    return bool(host) and urlsplit(origin).netloc == host


def error_body(path: str, message: str, param: Optional[str]) -> bytes:
    """The protocol's own error shape: OpenAI's under /v1, TGI's elsewhere."""
    if path.startswith("/v1/"):
        body: dict = {"error": {"message": message, "type": "invalid_request_error", "param": param,
                                "code": "validation"}}
    else:
        body = {"error": message, "error_type": "validation"}
    return json.dumps(body).encode()


class BodyLimit:
    """Reads a request's body up to the limit before the app sees it: a larger one is a 413,
    whether it announces its size (Content-Length) or not (chunked)."""

    def __init__(self, app: ASGIApp, limits: Callable[[], RequestLimits] = RequestLimits.from_env):
        self.app = app
        self.max_bytes = limits().max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await self._refuse(scope, send)
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client left while sending
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                return await self._refuse(scope, send)
            more = message.get("more_body", False)
        await self.app(scope, _replay(b"".join(chunks), receive), send)

    async def _refuse(self, scope: Scope, send: Send) -> None:
        body = error_body(scope.get("path", ""), f"body: larger than {self.max_bytes} bytes "
                                                 f"(LLM_MAX_BODY_BYTES)", "body")
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"connection", b"close"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


def _replay(body: bytes, receive: Receive) -> Receive:
    """The body once, then whatever the client sends next (its disconnect)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()
    return replay
