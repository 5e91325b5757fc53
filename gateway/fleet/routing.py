"""The gateway's way to the executor's replicas: every protocol's request goes through one
RoutingStreamer, which stands in for Jina's GatewayStreamer (Jina's gRPC servicer and the HTTP
routes both call it) and sends each request to the replica the router picks (router.py).

A stream is safe whatever happens to its replica:
- a call that fails before its first document goes to another replica (nothing was sent on);
- a stream that breaks after it (the replica killed, restarted, drained) goes on on another
  replica from its prompt, its seed and the tokens already sent (`resume_tokens`). The engine is
  batch-invariant, its sampling a function of (seed, position), and the tokens so far are replayed
  through every policy, so what follows is byte for byte what the lost replica would have sent:
  nothing repeated, nothing lost. The gateway draws a sampled request's seed itself when the
  client sent none, so that it knows it. A request with several answers (n > 1) cannot move, nor
  one with no replica left: it ends with an error, as before.
Unary endpoints: /stats and /metrics gather every replica's (the metrics labelled by replica),
/info is a replica's plus the router's; the others go to the least busy replica. An endpoint of
another deployment of the Flow (the embedder's: contract/endpoints.py) goes to that deployment, its
replicas in Jina's round robin.

Several models (models.py): each request goes to the fleet of the model its document names, and
one that names a model none serves is refused there, naming the served ones. The unary endpoints
go to the model that their document names; /models lists every model's /info.
"""
import asyncio
import json
import logging
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any, Optional

from docarray import DocList
from jina.proto import jina_pb2
from jina.serve.runtimes.gateway.streamer import GatewayStreamer
from jina.types.request.data import DataRequest, SingleDocumentRequest

from contract import ModelNotServedError
from contract.endpoints import DEPLOYMENT_OF, MODELS
from contract.limits import draw_seed as new_seed
from gateway.edge import jina_patches
from gateway.fleet.channels import streamer as new_streamer
from gateway.fleet.fleet import Fleet
from gateway.fleet.models import ModelFleets
from gateway.fleet.replicas import deployments, one_node_graph
from gateway.mapping.policies import Handed, sampled
from schemas import ModelOutputDocument
from schemas.wire import fill

log = logging.getLogger(__name__)


class Migration:
    """What a stream has sent its client, to go on from it elsewhere."""

    def __init__(self, request: SingleDocumentRequest):
        data = request.proto.document.data
        self.request = request
        self.n = data["n"].integer if "n" in data and data["n"].WhichOneof("content") else 1
        self.handed = Handed(_ints(data["resume_tokens"]) if "resume_tokens" in data else ())
        self.documents = 0  # sent on to the client

    @property
    def movable(self) -> bool:
        return self.n <= 1

    @property
    def sent_any(self) -> bool:
        return self.documents > 0

    def sent(self, out: Any) -> None:
        """A document on its way to the client: its tokens and text are the client's now."""
        self.documents += 1
        self.handed.sent(_ints(out["token_ids"]) if "token_ids" in out else [],
                         out["text"].text if "text" in out else "")

    def patch(self, out: Any) -> None:
        """A resumed stream's `generated_text` starts where the lost replica's left off."""
        if self.handed.prefix and "generated_text" in out:
            out["generated_text"].text = self.handed.generated_text(out["generated_text"].text)

    def resumed(self) -> SingleDocumentRequest:
        """The request once more, going on from the tokens sent so far."""
        request = SingleDocumentRequest()
        request.proto.CopyFrom(self.request.proto)
        node = request.proto.document.data["resume_tokens"]
        node.Clear()
        fill(node, self.handed.resume_tokens())
        return request


def _ints(node: Any) -> list[int]:
    return [item.integer for item in node.list.data]


def draw_seed(request: SingleDocumentRequest) -> None:
    """A sampled request without a seed gets one here, where a move to another replica needs it
    (the engine reports it as it reports a seed it drew)."""
    data = request.proto.document.data
    temperature = _number(data["temperature"]) if "temperature" in data and data["temperature"].WhichOneof(
        "content") else None
    if sampled("do_sample" in data and data["do_sample"].boolean, temperature) and (
            "seed" not in data or data["seed"].WhichOneof("content") is None):
        data["seed"].text = str(new_seed())


def _number(node: Any) -> float:
    return node.float if node.WhichOneof("content") == "float" else node.integer


class RoutingStreamer:
    """Jina's GatewayStreamer, with every request routed (see the module docstring); what it
    does not override, Jina's own streamer for all replicas does (endpoint discovery, schemas)."""

    def __init__(self, inner: GatewayStreamer, models: ModelFleets, others: Optional[dict[str, Any]] = None):
        self._inner, self.models = inner, models
        self.others = others or {}  # another deployment's name -> Jina's streamer for it alone

    def elsewhere(self, endpoint: Optional[str]) -> Optional[Any]:
        """The streamer of the deployment that serves `endpoint`, when not the generating one."""
        name = DEPLOYMENT_OF.get(endpoint or "")
        if name is None:
            return None
        if name not in self.others:
            raise NotServed(f"{endpoint}: this Flow has no {name} deployment")
        return self.others[name]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def rpc_stream_doc(self, request: SingleDocumentRequest, **kwargs: Any) -> AsyncIterator[Any]:
        data = request.proto.document.data
        try:
            fleet, model_id, adapter = await self.models.find(_model(data))
        except ModelNotServedError as exc:
            yield _refusal(exc)
            return
        if model_id is not None:
            data["model"].text = model_id  # as the executor knows it (Ollama's name has a tag)
        draw_seed(request)
        migration, current = Migration(request), request
        keys = await fleet.keys(data, adapter)
        tried: set = set()
        while True:
            replica = await fleet.pick(keys, frozenset(tried))
            tried.add(replica)
            replica.streams += 1
            try:
                async with aclosing(replica.streamer.rpc_stream_doc(request=current, **kwargs)) as results:
                    async for result in results:  # closed with this generator: the call ends with it
                        out = result.proto.document.data
                        migration.patch(out)
                        migration.sent(out)
                        yield result
                return
            except (asyncio.CancelledError, GeneratorExit):
                raise
            except Exception as exc:  # noqa: BLE001 - the replica failed (gone, restarting, unreachable)
                replica.lost()
                current = self._next(fleet, migration, current, exc, replica, tried)
            finally:
                replica.streams -= 1

    @staticmethod
    def _next(fleet: Fleet, migration: Migration, current: SingleDocumentRequest, exc: BaseException,
              replica: Any, tried: set) -> SingleDocumentRequest:
        """After a replica failed: the same request elsewhere (nothing was sent on yet), or the
        request resumed from what was; an answer of several cannot move."""
        others = [r for r in fleet.replicas if r not in tried]
        if not migration.sent_any:
            if not others:
                raise exc
            log.warning("replica %d failed before its first document (%s): another one takes it", replica.index, exc)
            return current
        if not migration.movable or not others:
            raise exc
        log.warning("replica %d broke a stream after %d tokens (%s): it goes on on another replica",
                    replica.index, len(migration.handed.tokens), exc)
        fleet.migrations += 1
        return migration.resumed()

    async def stream_doc(self, doc: Any, return_results: bool = False, exec_endpoint: Optional[str] = None,
                         **kwargs: Any) -> AsyncIterator[tuple[Any, Any]]:
        """As Jina's: the document in a request, then (result or document, error) pairs."""
        request = SingleDocumentRequest()
        request.document_cls = doc.__class__
        request.data.doc = doc
        if exec_endpoint:
            request.header.exec_endpoint = exec_endpoint
        async for result in self.rpc_stream_doc(request):
            error = result.status.exception if result.status.code == jina_pb2.StatusProto.ERROR else None
            yield (result if return_results else result.data.doc), error

    async def stream_docs(self, docs: Any, exec_endpoint: Optional[str] = None, **kwargs: Any) -> AsyncIterator[Any]:
        other = self.elsewhere(exec_endpoint)
        if other is not None:
            async for result in other.stream_docs(docs, exec_endpoint=exec_endpoint, **kwargs):
                yield result
            return
        name = getattr(docs[0], "model", None) if len(docs) else None
        fleet, answer = await self._fleet_of(name)
        if answer is None and exec_endpoint == MODELS:
            answer = ModelOutputDocument(text=json.dumps(await self.models.infos()))
        elif answer is None:
            text = await (fleet.unary if name else self.models.unary)(exec_endpoint or "")
            answer = ModelOutputDocument(text=text) if text is not None else None
        if answer is not None:  # the gateway's own answer: a refusal, or what speaks for several
            docs_out = DocList[ModelOutputDocument]([answer])
            if not kwargs.get("return_results"):
                yield docs_out
                return
            result = DataRequest()  # as Jina's HTTP routes read an executor's answer
            result.document_array_cls = DocList[ModelOutputDocument]
            result.data.docs = docs_out
            yield result
            return
        replica = await fleet.pick([], frozenset())
        async for result in replica.streamer.stream_docs(docs, exec_endpoint=exec_endpoint, **kwargs):
            yield result

    async def _fleet_of(self, name: Optional[str]) -> tuple[Fleet, Optional[ModelOutputDocument]]:
        """(the fleet of the model named, None), or (the first, the refusal) when none serves it."""
        try:
            return (await self.models.find(name))[0], None
        except ModelNotServedError as exc:
            return self.models.fleets[0], _error_document(exc)

    async def process_single_data(self, request: Any, context: Any = None) -> Any:
        """Jina's unary call (gRPC /generate): the least busy replica, or the router's pick."""
        other = self.elsewhere(request.header.exec_endpoint)
        if other is not None:
            return await other.process_single_data(request, context)
        fleet, _ = await self._fleet_of(_first_model(request))  # a name none serves: its executor refuses it
        replica = await fleet.pick([], frozenset())
        return await replica.streamer.process_single_data(request, context)

    async def rpc_stream(self, request_iterator: Any, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        """Jina's streamed calls (its clients' `post`): where the first request's endpoint is served."""
        first, requests = await _peek(request_iterator)
        other = self.elsewhere(first.header.exec_endpoint) if first is not None else None
        if other is None:
            fleet, _ = await self._fleet_of(_first_model(first) if first is not None else None)
            other = (await fleet.pick([], frozenset())).streamer
        streamer = other
        async for response in streamer.rpc_stream(requests, *args, **kwargs):
            yield response

    async def close(self) -> None:
        await self.models.close()
        for other in self.others.values():
            await other.close()
        await self._inner.close()


def _model(data: Any) -> Optional[str]:
    """The model a request's document names (None: none)."""
    return data["model"].text or None if "model" in data and data["model"].WhichOneof("content") == "text" else None


def _first_model(request: Any) -> Optional[str]:
    """The model that a unary request's first document names (None: none, or not readable)."""
    try:
        docs = request.proto.data.docs.docs
        return _model(docs[0].data) if len(docs) else None
    except AttributeError:
        return None


def _error_document(exc: ModelNotServedError) -> ModelOutputDocument:
    return ModelOutputDocument(finish_reason="error", error=str(exc), error_type=exc.kind.value, error_field=exc.field)


def _refusal(exc: ModelNotServedError) -> SingleDocumentRequest:
    """A stream's one and last document: the refusal of a model none serves."""
    response = SingleDocumentRequest()
    response.document_cls = ModelOutputDocument
    response.data.doc = _error_document(exc)
    return response


class NotServed(LookupError):
    """An endpoint of a deployment that this Flow does not have (embeddings turned off, say)."""


async def _peek(requests: Any) -> tuple[Any, AsyncIterator[Any]]:
    """The first of a stream of requests (sync or async), and the whole stream again."""
    iterator = requests.__aiter__() if hasattr(requests, "__aiter__") else iter(requests)
    try:
        first = await iterator.__anext__() if hasattr(iterator, "__anext__") else next(iterator)
    except (StopAsyncIteration, StopIteration):
        first = None

    async def again() -> AsyncIterator[Any]:
        if first is None:
            return
        yield first
        if hasattr(iterator, "__anext__"):
            async for request in iterator:
                yield request
        else:
            for request in iterator:
                yield request
    return first, again()


def install(server: Any) -> None:
    """Route `server`'s requests (Jina's gRPC or HTTP server in the gateway) through the fleet of
    replicas that its runtime arguments name, and the other deployments' endpoints to them; a
    gateway with no generating deployment keeps Jina's streamer."""
    fleets = Fleet.shared(server.runtime_args, server.logger)
    if not fleets:
        return
    generating = {fleet.members.deployment for fleet in fleets}
    others = {name: new_streamer(one_node_graph(name), {name: addresses}, logger=server.logger)
              for name, addresses in deployments(getattr(server.runtime_args, "deployments_addresses", "{}")).items()
              if name not in generating}
    jina_patches.replace_streamer(server, lambda inner: RoutingStreamer(inner, ModelFleets(fleets), others))
