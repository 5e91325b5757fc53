"""Each patch of gateway/edge/jina_patches.py against the installed Jina: what it replaces or reads
is still where it was, with the signature it was written for, and the patch is in place. A Jina
upgrade that moves one of them fails here, by name, before any Flow starts. The servers are a real
LLMGateway built as Jina's runtime builds it (no port bound, no executor called)."""
import asyncio
import importlib.util
import inspect
import json
import re
import subprocess
import sys
from types import ModuleType

import jina
import pytest
from jina.serve.networking.connection_stub import _ConnectionStubs

from gateway.edge import jina_patches
from tests.conftest import ROOT, on_a_new_loop


def pristine(module: ModuleType) -> ModuleType:
    """A fresh copy of a module from its file, as it was before any patch."""
    spec = importlib.util.spec_from_file_location(f"pristine_{module.__name__.replace('.', '_')}", module.__file__)
    assert spec is not None and spec.loader is not None
    copy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(copy)
    return copy


def parameters(function) -> list[tuple[str, object]]:
    return [(p.name, p.default) for p in inspect.signature(function).parameters.values()]


def source(function) -> str:
    return inspect.getsource(function)


@pytest.fixture(scope="module")
def gateway():
    """The Flow's gateway (gateway/gateway.yml's LLMGateway) with its gRPC and HTTP servers, built
    from the arguments Jina's runtime gives it, for one replica of the executor."""
    from jina.parsers import set_gateway_parser
    from jina.serve.runtimes.gateway.request_handling import GatewayRequestHandler

    from gateway.composite import LLMGateway
    args = set_gateway_parser().parse_args([
        "--protocol", "grpc", "http", "--port", "52345", "52346",
        "--graph-description", json.dumps({"start-gateway": ["llm"], "llm": ["end-gateway"]}),
        "--deployments-addresses", json.dumps({"llm": ["127.0.0.1:52347"]})])
    runtime_args = {**vars(args), "default_port": False, "gateway_load_balancer": False, "timeout_send": None}
    built = LLMGateway(name="gateway", runtime_args=runtime_args, req_handler_cls=GatewayRequestHandler)
    yield built
    loop = asyncio.new_event_loop()  # not asyncio.run, which leaves the thread no event loop for later tests
    try:
        loop.run_until_complete(built.servers[0].streamer.close())
    finally:
        loop.close()




def jinas_streamer(streamer):
    """Jina's GatewayStreamer under the RoutingStreamers that wrap it."""
    from gateway.fleet.routing import RoutingStreamer
    while isinstance(streamer, RoutingStreamer):
        streamer = streamer._inner
    return streamer


# --- the version ---------------------------------------------------------------------------------

def test_the_patches_are_written_for_the_jina_the_project_pins():
    assert jina.__version__ == jina_patches.JINA_VERSION
    for name in ("pyproject.toml", "requirements.txt", "constraints.txt"):
        pins = re.findall(r'^\s*"?jina==([0-9.]+)"?,?\s*$', (ROOT / name).read_text(), re.MULTILINE)
        assert pins == [jina_patches.JINA_VERSION], name


def test_another_jina_stops_the_import_naming_the_module_and_both_versions(monkeypatch):
    monkeypatch.setattr(jina, "__version__", "3.35.0")
    with pytest.raises(ImportError) as refused:
        pristine(jina_patches)  # imported afresh, as a Jina upgrade would import it
    message = str(refused.value)
    assert "gateway/edge/jina_patches.py" in message and "jina 3.35.0" in message, message
    assert f"jina=={jina_patches.JINA_VERSION}" in message, message
    jina_patches.check_jina_version(jina_patches.JINA_VERSION)  # the pinned one passes
    with pytest.raises(jina_patches.JinaVersionError):
        jina_patches.check_jina_version("3.33.1")


# --- call ends: _ConnectionStubs.send_single_doc_request -------------------------------------------

def test_call_ends_replaces_a_method_jina_still_has_with_its_signature():
    from jina.serve.networking import connection_stub
    jinas = pristine(connection_stub)._ConnectionStubs.send_single_doc_request
    assert inspect.isasyncgenfunction(jinas) and inspect.isasyncgenfunction(jina_patches.send_single_doc_request)
    assert parameters(jina_patches.send_single_doc_request) == parameters(jinas)


def test_call_ends_reads_private_names_jina_still_has():
    stubs = _ConnectionStubs("127.0.0.1:1", None, "llm", None, None)
    assert stubs._initialized is False
    assert inspect.iscoroutinefunction(_ConnectionStubs._init_stubs)
    assert "self.stream_doc_stub =" in source(_ConnectionStubs._init_stubs)
    assert parameters(_ConnectionStubs._get_metric_timer) == [("self", inspect.Parameter.empty)]
    for recorder in (_ConnectionStubs._record_request_bytes_metric, _ConnectionStubs._record_received_bytes_metric):
        assert parameters(recorder) == [("self", inspect.Parameter.empty), ("nbytes", inspect.Parameter.empty)]


def test_jinas_retries_call_it_and_retry_only_a_grpc_error():
    """StreamBroken is not retried because Jina's retry loop retries an AioRpcError alone."""
    from jina.serve.networking import GrpcConnectionPool
    retries = source(GrpcConnectionPool._send_single_doc_request)
    assert ".send_single_doc_request(" in retries and "except AioRpcError" in retries
    assert not issubclass(jina_patches.StreamBroken, jina_patches.grpc.aio.AioRpcError)


def test_call_ends_is_installed_when_jina_loads_the_gateway():
    import gateway.composite  # noqa: F401 - what Jina imports in the gateway's process
    assert _ConnectionStubs.send_single_doc_request is jina_patches.send_single_doc_request


# --- request handler: the streamer of BaseServer._request_handler ----------------------------------

def test_every_server_of_the_gateway_routes_through_one_routing_streamer(gateway):
    from jina.serve.runtimes.gateway.request_handling import GatewayRequestHandler
    from jina.serve.runtimes.gateway.streamer import GatewayStreamer

    from gateway.fleet.routing import RoutingStreamer
    for server in gateway.servers:
        handler = server._request_handler
        assert isinstance(handler, GatewayRequestHandler)
        assert isinstance(handler.streamer, RoutingStreamer) and isinstance(server.streamer, RoutingStreamer)
        assert isinstance(jinas_streamer(handler.streamer), GatewayStreamer)
    assert gateway.servers[-1].streamer is gateway._request_handler.streamer  # the servers share one handler


# --- gRPC servicer: the request handler's methods and _status --------------------------------------

def test_the_grpc_servicer_methods_have_the_signatures_the_edge_wraps():
    from jina.serve.runtimes.gateway.request_handling import GatewayRequestHandler as Handler
    from jina.serve.runtimes.servers.grpc import GRPCServer
    assert inspect.isasyncgenfunction(Handler.stream_doc)
    assert [n for n, _ in parameters(Handler.stream_doc)] == ["self", "request", "context"]
    assert inspect.iscoroutinefunction(Handler.process_single_data)
    assert parameters(Handler.process_single_data) == [("self", inspect.Parameter.empty), ("request", inspect.Parameter.empty),
                                                       ("context", None)]
    assert Handler.Call is Handler.stream and inspect.isasyncgenfunction(Handler.stream)
    assert [n for n, _ in parameters(Handler.stream)][:3] == ["self", "request_iterator", "context"]
    assert inspect.iscoroutinefunction(Handler._status)
    assert [n for n, _ in parameters(Handler._status)] == ["self", "empty", "context"]
    registered = source(GRPCServer.setup_server)
    for service in ("JinaRPC", "JinaSingleDataRequestRPC", "JinaSingleDocumentRequestRPC", "JinaInfoRPC"):
        assert re.search(rf"add_{service}Servicer_to_server\(\s*self\._request_handler,", registered), service


def test_the_grpc_servicer_is_wrapped_and_its_status_replaced(gateway):
    from gateway.edge.grpc_edge import StatusGRPCGateway, checked_at_the_edge, checked_data
    server = next(s for s in gateway.servers if isinstance(s, StatusGRPCGateway))
    jina_patches.wrap_grpc_servicer(server, checked_at_the_edge, checked_data)  # as its setup_server does
    handler = server._request_handler
    assert handler.stream_doc.__name__ == "stream_doc_at_the_edge"
    assert handler.process_single_data.__name__ == "process_single_data_at_the_edge"
    assert handler.Call.__name__ == "stream_at_the_edge"
    assert handler._status is jina_patches.no_status


def test_the_executors_endpoints_are_read_where_jina_keeps_them(gateway):
    from jina.serve.runtimes.gateway.graph import topology_graph
    from jina.serve.runtimes.gateway.streamer import GatewayStreamer
    assert "self._endpoints_models_map =" in source(GatewayStreamer._get_endpoints_input_output_models)
    assert "'is_generator'" in inspect.getsource(topology_graph)
    routed = gateway.servers[0].streamer
    jinas = jinas_streamer(routed)
    assert jinas._endpoints_models_map is None and jina_patches.executor_streaming(routed) == {}
    jinas._endpoints_models_map = {"/stream": {"is_generator": True}, "/generate": {"is_generator": False},
                                   "_jina_dry_run_": {"is_generator": False}}
    try:
        assert jina_patches.executor_streaming(routed) == {"/stream": True, "/generate": False}
    finally:
        jinas._endpoints_models_map = None


# --- composite: CompositeBaseServer._server_kwargs and the runtime's cancel event ------------------

def test_the_composite_reads_jinas_server_arguments(gateway):
    from jina.serve.runtimes.servers.composite import CompositeBaseServer
    assert isinstance(inspect.getattr_static(CompositeBaseServer, "_server_kwargs"), property)
    kwargs = jina_patches.server_kwargs(gateway)
    assert [str(k["runtime_args"]["protocol"]).lower().split(".")[-1] for k in kwargs] == ["grpc", "http"]
    assert all(k["req_handler"] is gateway._request_handler for k in kwargs)


def test_the_servers_wait_on_the_event_jinas_runtime_hands_the_composite(gateway):
    from jina.serve.runtimes.asyncio import AsyncNewLoopRuntime
    from jina.serve.runtimes.servers import BaseServer
    from jina.serve.runtimes.servers.grpc import GRPCServer
    from jina.serve.runtimes.servers.http import FastAPIBaseServer
    assert "server.is_cancel = self.is_cancel" in source(AsyncNewLoopRuntime._get_server)
    assert "is_cancel" in inspect.signature(BaseServer.__init__).parameters
    for server_class in (GRPCServer, FastAPIBaseServer):  # they wait for the executors' endpoints on it
        assert "is_cancel=self.is_cancel" in source(server_class.setup_server), server_class
    handed = asyncio.Event()
    gateway.is_cancel = handed  # as the runtime does once it has built the gateway
    jina_patches.hand_cancel_event(gateway)
    assert all(server.is_cancel is handed for server in gateway.servers)


# --- HTTP routes: Jina's app, less the routes replaced -------------------------------------------

def test_jinas_http_app_has_the_routes_replaced_and_the_gateways_app_has_none_of_them(gateway):
    """Jina adds its routes to its app itself (the gateway's protocols are included routers): the
    ones replaced are there, by path and method, and gone from the gateway's app."""
    from jina.serve.runtimes.gateway.http import HTTPGateway

    from gateway.composite import LLMHTTPGateway
    from schemas import ModelOutputDocument, PromptDocument
    server = next(s for s in gateway.servers if isinstance(s, LLMHTTPGateway))
    jinas = jinas_streamer(server.streamer)
    unary = {"input": PromptDocument, "output": ModelOutputDocument, "is_generator": False, "parameters": None}
    jinas._endpoints_models_map = {"/stream": {**unary, "is_generator": True}, "/generate": unary, "/stats": unary,
                                   "/tokenize": unary, "/detokenize": unary}  # some of the executor's
    try:
        app = HTTPGateway.app.fget(server)  # Jina's own
        routes = {(r.path, m) for r in app.router.routes for m in getattr(r, "methods", None) or ()}
        assert jina_patches.REPLACED_JINA_ROUTES - {("/stats", "GET")} <= routes  # Jina's /stats is a POST
        jina_patches.strip_jina_routes(app)
        assert not any(jina_patches.replaced(r) for r in app.router.routes)
        ours = server.app
    finally:
        jinas._endpoints_models_map = None
    jinas_kept = [r for r in ours.router.routes
                  if jina_patches.replaced(r) and getattr(r, "endpoint", None).__module__.startswith("jina")]
    assert jinas_kept == []


# --- banner: Flow._get_summary_table ---------------------------------------------------------------

def test_the_banner_replaces_a_method_jina_still_calls_with_its_signature():
    from jina import Flow
    assert [n for n, _ in parameters(jina_patches._jinas_summary_table)] == ["self", "all_panels"]
    assert "self._get_summary_table(all_panels)" in source(Flow._wait_until_all_ready)
    import gateway.banner  # noqa: F401 - as flows/llm.yml's py_modules imports it
    assert Flow._get_summary_table is not jina_patches._jinas_summary_table
    assert Flow._get_summary_table.__wrapped__ is jina_patches._jinas_summary_table


def test_no_public_address_replaces_the_property_jinas_banner_still_reads():
    from jina import Flow
    from jina.orchestrate.orchestrator import BaseOrchestrator
    jinas = pristine(importlib.import_module("jina.orchestrate.orchestrator")).BaseOrchestrator
    assert "get_public_ip()" in source(jinas.address_public.fget)
    assert "self.address_public" in source(jina_patches._jinas_summary_table)
    import gateway.banner  # noqa: F401 - as flows/llm.yml's py_modules imports it
    assert BaseOrchestrator.address_public.fget is jina_patches._no_public_address
    assert issubclass(Flow, BaseOrchestrator)


# --- discovery: TopologyGraph._get_all_endpoints, after the executors listen ----------------------

def test_the_discovery_gate_wraps_a_method_jina_still_has_with_its_signature():
    from jina.serve.runtimes.gateway.graph import topology_graph
    jinas = pristine(topology_graph).TopologyGraph._get_all_endpoints
    assert parameters(jinas) == [("self", inspect.Parameter.empty), ("connection_pool", inspect.Parameter.empty),
                                 ("retry_forever", False), ("is_cancel", None)]
    assert "await asyncio.sleep(1)" in source(jinas) and "self._all_endpoints" in source(jinas)
    for server_class in ("grpc", "http"):  # Jina's servers wait in it, retrying for ever
        module = importlib.import_module(f"jina.serve.runtimes.servers.{server_class}")
        assert "_get_endpoints_input_output_models" in inspect.getsource(module)


def test_the_discovery_gate_is_installed_when_jina_loads_the_gateway():
    from jina.serve.runtimes.gateway.graph.topology_graph import TopologyGraph

    import gateway.composite  # noqa: F401 - what Jina imports in the gateway's process
    assert TopologyGraph._get_all_endpoints.__wrapped__ is jina_patches._jinas_get_all_endpoints


def test_the_gate_reads_the_executors_addresses_where_jinas_pool_keeps_them(gateway):
    jinas = jinas_streamer(gateway.servers[0].streamer)
    assert jina_patches.deployment_addresses(jinas.topology_graph, jinas._connection_pool) == [["127.0.0.1:52347"]]


def test_a_gateway_stopped_while_its_executor_loads_stops_waiting(gateway):
    """Nothing listens on the executor's address: the gate waits, and gives up with the runtime's
    cancel event, as Jina's retries do."""
    jinas = jinas_streamer(gateway.servers[0].streamer)

    async def stopped_after(seconds: float) -> object:
        cancel = asyncio.Event()
        asyncio.get_running_loop().call_later(seconds, cancel.set)
        return await asyncio.wait_for(jinas.topology_graph._get_all_endpoints(
            jinas._connection_pool, retry_forever=True, is_cancel=cancel), timeout=10)
    assert on_a_new_loop(stopped_after(0.2)) is None


# --- the executor's: WorkerRequestHandler.endpoint_discovery, its answer computed once ------------

def test_the_executors_discovery_wraps_a_method_jina_still_has_reading_what_it_read():
    from jina.serve.runtimes.worker import request_handling

    from executors import discovery
    jinas = pristine(request_handling).WorkerRequestHandler.endpoint_discovery
    assert parameters(jinas) == parameters(discovery.endpoint_discovery)
    used = set(re.findall(r"self\.(\w+)", source(jinas)))
    assert used == {"_executor", "logger"}, used  # all the handler that prepare() makes ahead has


def test_the_executors_answer_is_jinas_computed_once(monkeypatch):
    from types import SimpleNamespace

    from jina import Executor, requests
    from jina.serve.runtimes.worker.request_handling import WorkerRequestHandler

    from executors import discovery
    from schemas import ModelOutputDocument, PromptDocument

    class Tiny(Executor):
        @requests(on="/stream")
        async def stream(self, doc: PromptDocument, **kwargs) -> ModelOutputDocument:
            return ModelOutputDocument()

    executor = Tiny()
    computed = []
    jinas_models = executor._get_endpoint_models_dict
    monkeypatch.setattr(executor, "_get_endpoint_models_dict", lambda: computed.append(1) or jinas_models())
    discovery.install()
    assert WorkerRequestHandler.endpoint_discovery is discovery.endpoint_discovery
    handler = SimpleNamespace(_executor=executor, logger=executor.logger)
    expected = on_a_new_loop(discovery._jinas_endpoint_discovery(handler, None, None))
    computed.clear()
    discovery.prepare(executor)
    answers = [on_a_new_loop(discovery.endpoint_discovery(handler, None, None))
               for _ in range(3)]
    assert all(answer == expected for answer in answers) and "/stream" in expected.endpoints
    assert len(computed) == 1


# --- the launcher's: jina.helper.warn_unknown_args, nothing built for nothing to warn of ---------

def test_the_launcher_skips_only_the_warnings_with_nothing_to_warn_of(monkeypatch):
    """Jina's Flow reading still hands its leftovers to the function the launcher wraps
    (deploy/jina_cli.py), whose signature is unchanged; an empty call builds no table of
    arguments, and an unknown argument is still warned of."""
    import jina.helper
    import jina_cli.lookup

    from deploy import jina_cli as launcher
    jinas = pristine(jina.helper)
    assert "warn_unknown_args(_leftovers)" in source(jinas.ArgNamespace.kwargs2namespace)
    assert parameters(jinas.warn_unknown_args) == [("unknown_args", inspect.Parameter.empty)]
    assert "_build_lookup_table()" in source(jinas.warn_unknown_args)
    monkeypatch.setattr(jina.helper, "warn_unknown_args", jinas.warn_unknown_args)
    launcher.skip_empty_warnings()
    launcher.skip_empty_warnings()  # once is enough: a second call wraps nothing again
    built = []
    table = jina_cli.lookup._build_lookup_table
    monkeypatch.setattr(jina_cli.lookup, "_build_lookup_table", lambda: built.append(1) or table())
    jina.helper.warn_unknown_args(set())
    assert built == []
    with pytest.warns(UserWarning, match="--no-such-argument"):
        jina.helper.warn_unknown_args({"--no-such-argument"})
    assert built == [1]


def test_the_executor_imports_what_jinas_first_streaming_call_would_while_its_model_loads():
    """Jina's first call of an endpoint that is no coroutine function (an async generator's, as
    /stream's) imports uvloop (`get_or_reuse_loop`: 0.1 s of the executor's event loop, which held
    the first request after a start): prepare()'s thread imports it first. In a fresh interpreter."""
    from jina import helper
    from jina.serve import executors as jina_executors
    assert "import uvloop" in source(helper._update_policy)
    assert "get_or_reuse_loop()" in source(jina_executors.BaseExecutor.__acall_endpoint__)
    script = """
import sys, time
from jina import Executor, requests
from executors import discovery
from schemas import ModelOutputDocument, PromptDocument

class Tiny(Executor):
    @requests(on="/stream")
    async def stream(self, doc: PromptDocument, **kwargs) -> ModelOutputDocument:
        return ModelOutputDocument()

assert "uvloop" not in sys.modules
discovery.prepare(Tiny())
deadline = time.monotonic() + 20
while "uvloop" not in sys.modules and time.monotonic() < deadline:
    time.sleep(0.01)
print("uvloop" in sys.modules)
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip().splitlines()[-1:] == ["True"], done.stdout + done.stderr
