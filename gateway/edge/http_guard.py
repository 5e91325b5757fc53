"""What the HTTP port lets in: body size, cross-origin callers, debug pages.

Safe by default, opened deliberately with environment variables:
  LLM_MAX_BODY_BYTES  the largest request body (2 MB, TGI's), like every request limit
  LLM_CORS_ORIGINS    comma-separated origins that browsers may call from (and open the
                      WebSocket from), `*` for any; none by default: pages on other sites
                      cannot drive a service on your machine
  LLM_HTTP_DEBUG=1    serves /docs, /redoc, /openapi.json and Jina's /dry_run
  LLM_API_KEY         when set, every route but the health, metrics and chat-page ones needs
                      `Authorization: Bearer <key>` (the WebSocket: that header, or ?api_key=)
"""
import hmac
import json
from collections.abc import Callable
from typing import Optional
from urllib.parse import urlsplit

from fastapi.exception_handlers import http_exception_handler
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from contract import ErrorKind, RequestLimits
from contract.transport import ANTHROPIC_ERROR_TYPE, HTTP_STATUS, OPENAI_ERROR_TYPE
from gateway.config import config
from gateway.protocols.chat_files import ASSETS

DEBUG_PATHS = {"/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json", "/dry_run"}


def debug_enabled() -> bool:
    return config().http_debug


def cors_origins() -> list[str]:
    return list(config().cors_origins)


def origin_allowed(origin: Optional[str], host: Optional[str]) -> bool:
    """A browser's Origin: the page served by this port itself, or one of LLM_CORS_ORIGINS.
    Callers that are not browsers send no Origin and are let through."""
    if not origin:
        return True
    allowed = cors_origins()
    if "*" in allowed or origin.rstrip("/") in allowed:
        return True
    return bool(host) and urlsplit(origin).netloc == host


# GET: what probes, scrapers and browsers need (the chat page and the files it loads; not its
# settings, which name the models: the page sends its key for those)
OPEN_PATHS = {"/", "/health", "/metrics", "/chat-ui", *(f"/chat-ui/{name}" for name in ASSETS)}


def _open(scope: Scope) -> bool:
    """An HTTP request that needs no key: a GET of OPEN_PATHS."""
    return scope["method"] in ("GET", "HEAD") and scope["path"] in OPEN_PATHS


def error_body(path: str, message: str, param: Optional[str], kind: ErrorKind = ErrorKind.VALIDATION) -> bytes:
    """The protocol's own error shape: Anthropic's under /v1/messages, OpenAI's elsewhere under
    /v1, Ollama's under /api, TGI's elsewhere."""
    if path.startswith("/api/"):
        body: dict = {"error": message}
    elif path.startswith("/v1/messages"):
        body = {"type": "error", "error": {"type": ANTHROPIC_ERROR_TYPE[kind], "message": message}}
    elif path.startswith("/v1/"):
        body = {"error": {"message": message, "type": OPENAI_ERROR_TYPE[kind], "param": param, "code": kind.value}}
    else:
        body = {"error": message, "error_type": kind.value}
    return json.dumps(body).encode()


def install_unrouted(app: Starlette) -> None:
    """A path that no route serves, or a method that its path does not take, is answered 404 or
    405 in the protocol's own error shape (error_body), as every other refusal is, rather than
    FastAPI's `{"detail": "Not Found"}`: an OpenAI client reads `error.message`. A route's own
    HTTPException keeps FastAPI's handling."""
    async def unrouted(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        path = request.url.path
        if exc.status_code == 404 and exc.detail == "Not Found":
            body = error_body(path, f"{path}: no such route here", None, ErrorKind.NOT_FOUND)
        elif exc.status_code == 405 and exc.detail == "Method Not Allowed":
            body = error_body(path, f"{path}: {request.method} is not served on this path", None)
        else:
            return await http_exception_handler(request, exc)
        return Response(body, exc.status_code, headers=exc.headers, media_type="application/json")

    app.add_exception_handler(HTTPException, unrouted)


def api_key() -> str:
    return config().api_key


def key_matches(authorization: Optional[str], key: str, x_api_key: Optional[str] = None) -> bool:
    """`Authorization: Bearer <key>`, or Anthropic's `x-api-key: <key>`, compared in constant time."""
    given = (authorization or "").removeprefix("Bearer ").strip()
    return hmac.compare_digest(given.encode(), key.encode()) or (
        x_api_key is not None and hmac.compare_digest(x_api_key.strip().encode(), key.encode()))


class ApiKey:
    """With LLM_API_KEY set: 401 (in the protocol's error shape) without the key; the open
    GET routes and the WebSocket (which checks the key itself, see ws_chat) pass."""

    def __init__(self, app: ASGIApp):
        self.app, self.key = app, api_key()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self.key or scope["type"] != "http" or _open(scope):
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        x_api_key = headers.get(b"x-api-key")
        if key_matches(headers.get(b"authorization", b"").decode("latin-1"), self.key,
                       x_api_key.decode("latin-1") if x_api_key is not None else None):
            return await self.app(scope, receive, send)
        body = error_body(scope["path"], "authorization: a valid API key is required (Authorization: Bearer <key>, "
                                         "or x-api-key: <key>)", None, ErrorKind.AUTHENTICATION)
        await send({"type": "http.response.start", "status": HTTP_STATUS[ErrorKind.AUTHENTICATION],
                    "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


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
