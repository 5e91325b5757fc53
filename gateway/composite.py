"""The Flow's gateway: Jina's gRPC gateway and one HTTP server with every HTTP protocol.

Jina's CompositeGateway picks Jina's own class per protocol, so custom HTTP routes
need a composite of our own: gRPC is Jina's GRPCGateway (stream_doc, unary
/generate) with refusals mapped to status codes, HTTP is Jina's HTTP app (/status,
docs...) plus our routes: Jina's SSE wire format on GET /stream (gateway/protocols/jina_sse.py
replaces Jina's route), OpenAI, TGI and WebSocket chat. Route collision: TGI's POST
/generate wins on HTTP, so Jina's unary POST /generate route is removed from the
HTTP app (it stays on gRPC). What of Jina's internals this needs, gateway/edge/jina_patches.py does.
"""
import logging
import warnings
from typing import Any

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from jina.serve.runtimes.gateway.gateway import BaseGateway
from jina.serve.runtimes.gateway.http import HTTPGateway
from jina.serve.runtimes.servers import BaseServer
from jina.serve.runtimes.servers.composite import CompositeBaseServer

from contract.lifecycle import die_with_parent
from gateway.config import config
from gateway.edge import jina_patches
from gateway.edge.backend import Backend
from gateway.edge.grpc_edge import StatusGRPCGateway
from gateway.edge.http_guard import DEBUG_PATHS, ApiKey, BodyLimit, cors_origins, debug_enabled, install_unrouted
from gateway.fleet import routing
from gateway.fleet.channels import bound_reconnects
from gateway.protocols.anthropic_routes import anthropic_router
from gateway.protocols.embedding_routes import embedding_router
from gateway.protocols.jina_sse import jina_sse_router
from gateway.protocols.ollama_routes import ollama_router
from gateway.protocols.openai_routes import openai_router
from gateway.protocols.ops_routes import ops_router
from gateway.protocols.responses_routes import responses_router
from gateway.protocols.tgi_routes import tgi_router
from gateway.protocols.tokens_routes import tokens_router
from gateway.protocols.ws_chat import chat_router

# Jina builds its HTTP models with pydantic v1-style configs: one warning per model, at start
warnings.filterwarnings("ignore", message="Valid config keys have changed in V2", category=UserWarning)

jina_patches.install_call_ends()  # the executor's generation ends with the request that asked for it
jina_patches.install_discovery_gate()  # the first try for the executors' endpoints once they listen


die_with_parent()  # as soon as Jina loads this module in the process it forked: its start may take a while


class LLMHTTPGateway(HTTPGateway):
    """Jina's HTTP gateway app with the OpenAI, TGI and chat routes added."""

    @property
    def app(self) -> FastAPI:
        app: FastAPI = super().app  # a new app each time; setup_server calls this once
        debug = debug_enabled()
        jina_patches.strip_jina_routes(app, also=lambda r: not debug and getattr(r, "path", None) in DEBUG_PATHS)
        app.add_middleware(BodyLimit)
        app.add_middleware(ApiKey)
        install_unrouted(app)
        if cors_origins():
            app.add_middleware(CORSMiddleware, allow_origins=cors_origins(), allow_methods=["*"],
                               allow_headers=["*"])
        backend = Backend(self.streamer)
        app.include_router(jina_sse_router(backend))
        app.include_router(openai_router(backend))
        app.include_router(tgi_router(backend))
        app.include_router(ops_router(backend))
        app.include_router(anthropic_router(backend))
        app.include_router(responses_router(backend))
        app.include_router(tokens_router(backend))
        app.include_router(ollama_router(backend))
        app.include_router(embedding_router(backend))
        app.include_router(chat_router(backend))
        return app

    async def setup_server(self) -> None:
        await super().setup_server()
        base = f"http://localhost:{self.port}"
        self.logger.info(f"HTTP routes: OpenAI {base}/v1 (chat, completions, responses) · Anthropic "
                         f"{base}/v1/messages · Ollama {base}/api · TGI {base}/generate_stream · "
                         f"Jina SSE {base}/stream · WebSocket ws://localhost:{self.port}/chat · "
                         f"chat page {base}/chat-ui")


class WaitingForExecutor(logging.Filter):
    """Jina's gateway warns every second while the executor loads its model: say it once."""

    def __init__(self) -> None:
        super().__init__()
        self.said = False

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith("Getting endpoints failed"):
            return True
        if self.said:
            return False
        self.said = True
        record.msg, record.args = "waiting for the executor to load its model...", ()
        record.levelno, record.levelname = logging.INFO, "INFO"
        return True


class LLMGateway(CompositeBaseServer, BaseGateway):
    """`gateway: uses: gateway/gateway.yml, protocol: [grpc, http]`: one server per protocol."""

    def __init__(self, **kwargs: Any):
        die_with_parent()  # a Flow stopped during its start must not leave it behind
        bound_reconnects(kwargs.get("runtime_args"))  # the servers' arguments are copied from these
        super().__init__(**kwargs)
        self.logger.logger.addFilter(WaitingForExecutor())
        classes = {"grpc": StatusGRPCGateway, "http": LLMHTTPGateway}
        self.servers: list[BaseServer] = []
        for server_kwargs in jina_patches.server_kwargs(self):
            if config().host:  # the address both ports bind to (default: all)
                server_kwargs["runtime_args"]["host"] = config().host
            protocol = str(server_kwargs["runtime_args"]["protocol"]).lower().split(".")[-1]
            if protocol not in classes:
                raise ValueError(f"protocol {protocol!r}: this gateway serves grpc and http")
            server = classes[protocol](**server_kwargs)
            routing.install(server)  # every request to the executor's replicas through one router
            self.servers.append(server)
        self.gateways = self.servers  # Jina's CompositeServer exposes both names

    async def setup_server(self) -> None:
        """The servers wait on the runtime's cancel event, which it handed this composite after
        building it (jina_patches.hand_cancel_event): a Flow stopped before its executors answered
        stops this gateway too."""
        jina_patches.hand_cancel_event(self)
        await super().setup_server()
