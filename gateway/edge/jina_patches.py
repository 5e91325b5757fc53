"""Every place where this project replaces or reaches into a private part of Jina, in one module.

Jina's gateway has no extension point for what this service needs of it (calls that end with their
request, a gRPC edge that refuses bad input, one router for every protocol, a banner that lists only
what is served), so the gateway replaces or reads a few of Jina's private methods and attributes.
Each is a named patch below: what it replaces or reads, and why. All were written against Jina
JINA_VERSION; no other module of the project names a private Jina attribute, they call these, but
two, which their processes install without loading the gateway's modules: executors/discovery.py,
the executor's own patch (its answer to endpoint discovery computed once), and deploy/jina_cli.py's
`skip_empty_warnings`, the launcher's (no table of every command's arguments built to warn of none).
tests/unit/test_jina_patches.py checks, for each patch, that what it relies on is still where it
was (names, signatures) and that it is in place.

An upgrade of Jina stops at import, here, with a message that says so, rather than in several
places at once and silently: check each patch against the new version (its tests first), then
change JINA_VERSION with the pins (pyproject.toml, requirements.txt, constraints.txt).
"""
import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any, Optional

import jina

JINA_VERSION = "3.34.0"  # the version every patch below was written against


class JinaVersionError(ImportError):
    """The installed Jina is not the one the patches were written against."""


def check_jina_version(installed: Optional[str] = None) -> None:
    """Refuse any Jina but JINA_VERSION: the patches reach into its internals, which move
    between versions without notice."""
    installed = installed or jina.__version__
    if installed != JINA_VERSION:
        raise JinaVersionError(
            f"gateway/edge/jina_patches.py patches the internals of jina {JINA_VERSION}, but jina {installed} "
            f"is installed: check each patch of gateway/edge/jina_patches.py against jina {installed} "
            f"(tests/unit/test_jina_patches.py), then set JINA_VERSION there and the pins in pyproject.toml, "
            f"requirements.txt and constraints.txt; or install jina=={JINA_VERSION}")


check_jina_version()

import grpc  # noqa: E402 - after the version check, which must come first
from fastapi import FastAPI  # noqa: E402
from jina import Flow  # noqa: E402
from jina.proto import jina_pb2  # noqa: E402
from jina.serve.networking import GrpcConnectionPool  # noqa: E402
from jina.serve.networking.connection_stub import _ConnectionStubs  # noqa: E402
from jina.serve.runtimes.gateway.graph.topology_graph import TopologyGraph  # noqa: E402

from gateway.edge.listening import until_listening  # noqa: E402

# --- Patch "call ends": _ConnectionStubs.send_single_doc_request, replaced ----------------------

class StreamBroken(RuntimeError):
    """The executor's stream failed after its first document: not to be retried."""


async def send_single_doc_request(self: _ConnectionStubs, request: Any, metadata: Any, compression: Any,
                                  timeout: Optional[float] = None) -> AsyncIterator[tuple[Any, None]]:
    """The gateway's calls to the executor end when the request that made them ends.

    Jina streams a document from the executor through a chain of async generators around a gRPC
    call (jina/serve/networking/connection_stub.py, `send_single_doc_request`). When a client goes
    away, the outermost generator is closed or abandoned, but the ones inside it are not closed: the
    gRPC call is cancelled only when they are garbage-collected, which a reference cycle can put off
    indefinitely. Meanwhile the executor keeps generating into a batch slot nobody reads.

    This replacement keeps Jina's behaviour (its private `_initialized`, `_init_stubs`,
    `stream_doc_stub` and metric recorders) and adds two deterministic ends to the call: `finally`
    when an exception (a cancellation) runs through it, and a done-callback on the task that made the
    call (the HTTP request, the WebSocket answer, the gRPC call of the client), which fires however
    that task ends.

    It also makes Jina's retries safe. Jina retries a failed call from the start (3 times by
    default; GrpcConnectionPool._send_single_doc_request retries an AioRpcError only), which repeats
    every token already streamed. A failure before the first document (a connection the executor
    closed, say) is still retried; one after it is raised as `StreamBroken`, which Jina's retry loop
    passes on instead of retrying, and the stream ends with one error.
    """
    if not self._initialized:
        await self._init_stubs()
    if not self.stream_doc_stub:
        raise ValueError("Can not send SingleDocumentRequest. gRPC endpoint not available.")
    self._record_request_bytes_metric(request.nbytes)
    call = self.stream_doc_stub.stream_doc(request, compression=compression, timeout=timeout,
                                           metadata=metadata)
    task = asyncio.current_task()
    if task is not None:
        task.add_done_callback(lambda _: call.cancel())
    streamed = False
    try:
        with self._get_metric_timer():
            async for response in call:
                self._record_received_bytes_metric(response.nbytes)
                streamed = True
                yield response, None
    except grpc.aio.AioRpcError as exc:
        if not streamed:
            raise  # nothing was sent on yet: Jina may retry
        raise StreamBroken(f"the executor's stream broke after its first document: "
                           f"{exc.code().name}: {exc.details()}") from None
    finally:
        call.cancel()  # no-op once the call has ended


def install_call_ends() -> None:
    """Idempotent; gateway/composite.py calls it when Jina loads the gateway's module."""
    _ConnectionStubs.send_single_doc_request = send_single_doc_request


# --- Patch "request handler": BaseServer._request_handler, its streamer replaced ---------------

def replace_streamer(server: Any, routed: Callable[[Any], Any]) -> None:
    """Every request of `server` (Jina's gRPC or HTTP server in the gateway) through the streamer
    that `routed` makes of Jina's GatewayStreamer (gateway/fleet/routing.py's RoutingStreamer).

    Jina's gRPC servicer is the server's private request handler (`_request_handler`, set in
    BaseServer.__init__), which calls its `streamer`; the HTTP routes call the server's `streamer`,
    a copy of it made in the same __init__. Both are replaced, with what wraps the handler's."""
    handler = server._request_handler
    handler.streamer = server.streamer = routed(handler.streamer)


# --- Patch "gRPC servicer": the request handler's methods and _status, replaced ----------------

def executor_streaming(streamer: Any) -> dict[str, bool]:
    """The executor's endpoints, whether each streams (empty while they are not known yet).

    Read off GatewayStreamer's private `_endpoints_models_map` (endpoint -> {'input', 'output',
    'is_generator', 'parameters'}), which Jina fills when the executor first answers its endpoint
    discovery; a RoutingStreamer passes the name on to Jina's. Jina's own `_jina_*` endpoints left out."""
    models = getattr(streamer, "_endpoints_models_map", None) or {}
    return {e: bool(m.get("is_generator")) for e, m in models.items() if not e.startswith("_jina")}


async def no_status(empty: Any, context: Any) -> jina_pb2.JinaInfoProto:
    """JinaInfoRPC/_status, as much as a health check says: it answers (Jina's answers with the
    environment and internal addresses)."""
    return jina_pb2.JinaInfoProto()


def wrap_grpc_servicer(server: Any, stream_doc: Callable[[Callable[..., AsyncIterator],
                                                          Callable[[], dict[str, bool]]], Callable[..., AsyncIterator]],
                       unary: Callable[[Callable[..., Any], Callable[..., AsyncIterator]],
                                       tuple[Callable[..., Any], Callable[..., AsyncIterator]]]) -> None:
    """The gRPC servicer of Jina's gateway `server` (its private `_request_handler`, which Jina's
    GRPCServer.setup_server registers for every service) with its methods wrapped, before that
    setup registers them: `stream_doc(method, streaming)` wraps JinaSingleDocumentRequestRPC's
    (`streaming` says which endpoints stream), `unary(process_single_data, Call)` wraps
    JinaSingleDataRequestRPC's and JinaRPC's; JinaInfoRPC's `_status` becomes `no_status`."""
    handler = server._request_handler
    handler.stream_doc = stream_doc(handler.stream_doc, lambda: executor_streaming(handler.streamer))
    handler.process_single_data, handler.Call = unary(handler.process_single_data, handler.Call)
    handler._status = no_status


# --- Patch "composite": CompositeBaseServer's server arguments and the runtime's cancel event ----

def server_kwargs(composite: Any) -> list[dict[str, Any]]:
    """The arguments of each of a composite gateway's servers, one per protocol, as Jina's own
    CompositeServer makes them (its private `_server_kwargs` property: a copy of the runtime
    arguments per port and protocol, and the composite's request handler, shared)."""
    kwargs: list[dict[str, Any]] = composite._server_kwargs
    return kwargs


def hand_cancel_event(composite: Any) -> None:
    """A composite's servers wait on its cancel event.

    Each server waits at its start for the executors' endpoints, retrying until its `is_cancel` event
    is set. Jina's runtime (AsyncNewLoopRuntime._get_server) hands its own event, the one its SIGTERM
    and SIGINT handlers set, to the gateway only after building it, so servers built in the
    composite's __init__ would keep theirs, never set: a Flow stopped or aborted before its executors
    answered (a model that cannot load, Ctrl-C during the load) would wait for this gateway forever.
    Called at the start of the composite's setup_server, after the runtime has handed it."""
    for server in composite.servers:
        server.is_cancel = composite.is_cancel


# --- Patch "HTTP routes": Jina's HTTP app, less the routes this gateway replaces -----------------

# Jina's HTTP routes that our protocols replace, and /status, which tells anyone the environment and
# internal addresses (TGI's /health says what a caller needs): (path, method). Route collision: TGI's
# POST /generate wins on HTTP, so Jina's unary POST /generate route goes (it stays on gRPC). Jina's
# /stats is a POST today; GET /stats is listed so that a Jina that adds one cannot shadow ours
# (Jina's routes come first in the app).
REPLACED_JINA_ROUTES = {("/generate", "POST"), ("/stream", "GET"), ("/status", "GET"), ("/stats", "GET"),
                        ("/tokenize", "POST"), ("/detokenize", "POST")}


def replaced(route: Any) -> bool:
    """Whether a route of Jina's app is one that this gateway replaces."""
    methods = getattr(route, "methods", None) or set()
    return any(getattr(route, "path", None) == p and m in methods for p, m in REPLACED_JINA_ROUTES)


def strip_jina_routes(app: FastAPI, also: Callable[[Any], bool] = lambda route: False) -> None:
    """Jina's HTTP app (HTTPGateway.app: Jina's get_fastapi_app, with a route per endpoint of the
    executor by its path and /status) less the routes REPLACED_JINA_ROUTES names and those `also` names."""
    app.router.routes = [r for r in app.router.routes if not replaced(r) and not also(r)]


# --- Patch "banner": Flow._get_summary_table, replaced --------------------------------------------

# Jina's own method, also where this module is imported a second time under another name
_jinas_summary_table = getattr(Flow._get_summary_table, "__wrapped__", Flow._get_summary_table)


def filter_summary_table(keep: Callable[[Any], bool]) -> None:
    """The Flow's start banner with only the panels `keep` keeps (gateway/banner.py).

    Jina prints the banner (its private `Flow._get_summary_table(all_panels)`, which fills the list
    of rich panels) when the Flow is ready. A Flow file can name no class of its own (Jina loads
    `jtype: Flow` alone), and Jina's `no_debug_endpoints` does not reach the banner, so the method
    is replaced: Jina's panels, less those `keep` refuses."""
    def summary_table(flow: Flow, all_panels: list[Any]) -> None:
        _jinas_summary_table(flow, all_panels)
        all_panels[:] = [p for p in all_panels if keep(p)]

    setattr(summary_table, "__wrapped__", _jinas_summary_table)  # noqa: B010 - a function's attribute, untyped
    Flow._get_summary_table = summary_table


# --- Patch "no public address": BaseOrchestrator.address_public, replaced ------------------------

def _no_public_address(orchestrator: Any) -> None:
    return None


def skip_public_address() -> None:
    """The start banner without the "Public" rows, and without looking them up.

    Jina's `address_public` asks three web services (api.ipify.org, ident.me,
    checkip.amazonaws.com; 0.3 s each) for the machine's public address whenever the banner reads
    it, as often as none answers (twice for flows/llm.yml's banner: once per port), and its bare `except:`
    swallows whatever comes meanwhile, Ctrl-C included: a Ctrl-C pressed while the banner was made
    (the gateway answers by then) was lost, the Flow's executors and gateway stopped, and `jina flow`
    waited in `Flow.block()` forever. Behind a firewall that drops the packets, each start also
    waited up to 1.8 s for nothing. What web services see says nothing of whether the ports are
    reachable from there, so the banner lists the local and private addresses only."""
    from jina.orchestrate.orchestrator import BaseOrchestrator

    BaseOrchestrator.address_public = property(_no_public_address)


# --- Patch "discovery": TopologyGraph._get_all_endpoints, wrapped ---------------------------------

# Jina's own method, also where this module is imported a second time under another name
_jinas_get_all_endpoints = getattr(TopologyGraph._get_all_endpoints, "__wrapped__",
                                   TopologyGraph._get_all_endpoints)


def deployment_addresses(graph: TopologyGraph, pool: GrpcConnectionPool) -> list[list[str]]:
    """Each executor deployment's replicas' addresses, as the connection pool that Jina's discovery
    asks through knows them (its private `_connections`, the replicas of each deployment's head)."""
    found = []
    for node in graph.all_nodes:
        replicas = pool._connections.get_replicas(node.name, True, increase_access_count=False)
        if replicas is not None:
            found.append([connection.address for connection in replicas.get_all_connections()])
    return found


_said: set[str] = set()  # what this process said once: its servers (gRPC, HTTP) each wait


def _say_once(logger: Any, message: str) -> None:
    if message not in _said:
        _said.add(message)
        logger.info(message)


def install_discovery_gate() -> None:
    """The gateway's first try for the executors' endpoints comes when they listen (gateway/edge/
    listening.py), not at Jina's next retry, a second or two later.

    Jina's servers wait at their start in `TopologyGraph._get_all_endpoints(pool, retry_forever=True,
    is_cancel)`, which retries each second. The wrapper waits first, then calls it. Idempotent;
    gateway/composite.py calls it when Jina loads the gateway's module."""
    async def get_all_endpoints(self: TopologyGraph, connection_pool: GrpcConnectionPool,
                                retry_forever: bool = False, is_cancel: Optional[asyncio.Event] = None) -> Any:
        if retry_forever and not self._all_endpoints:
            await until_listening(deployment_addresses(self, connection_pool), is_cancel,
                                  waiting=lambda: _say_once(self.logger, "waiting for the executor to load its model..."))
        return await _jinas_get_all_endpoints(self, connection_pool, retry_forever=retry_forever,
                                              is_cancel=is_cancel)

    setattr(get_all_endpoints, "__wrapped__", _jinas_get_all_endpoints)  # noqa: B010 - as the banner's
    TopologyGraph._get_all_endpoints = get_all_endpoints
