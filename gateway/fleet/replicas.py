"""The executor's replicas as the gateway's router sees them: one Jina GatewayStreamer each (the
Jina-native way in: a streamer per replica address, as Jina's own gateway builds one for all),
the load each one reports, and the prefix-cache blocks it is predicted to hold.

Load comes from the replicas: each answers /stats (running and waiting requests, KV blocks in use,
whether it drains) every `poll` seconds; between two reports, the requests routed to it since the
last are added, so that a burst is not all sent to the replica that was idle a moment ago.
"""
import asyncio
import collections
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import grpc
from docarray import DocList
from jina.excepts import InternalNetworkError

from contract.endpoints import DEPLOYMENT_OF
from schemas import ModelOutputDocument, PromptDocument

log = logging.getLogger(__name__)
UNREACHABLE = (InternalNetworkError, grpc.aio.AioRpcError, ConnectionError, OSError)  # a replica that is not there


@dataclass
class Load:
    """A replica's own report (its /stats)."""

    running: int = 0
    waiting: int = 0
    kv_used: float = 0.0  # of its KV cache's blocks
    draining: bool = False
    steps: int = 0  # its engine's steps so far: fewer than before means it restarted
    at: float = 0.0  # when it came (time.monotonic); 0: never


class BlockCache:
    """The prefix-cache keys a replica is predicted to hold, least recently used out first, bounded
    by its KV cache's size in blocks (what it can hold at most)."""

    def __init__(self, capacity: int = 4096):
        self.capacity = capacity
        self._keys: collections.OrderedDict[int, None] = collections.OrderedDict()

    def match(self, keys: list[int]) -> int:
        """How many of the keys, from the first, it holds (a key stands for its whole prefix)."""
        held = 0
        for key in keys:
            if key not in self._keys:
                break
            self._keys.move_to_end(key)
            held += 1
        return held

    def add(self, keys: list[int]) -> None:
        for key in keys:
            self._keys[key] = None
            self._keys.move_to_end(key)
        while len(self._keys) > self.capacity:
            self._keys.popitem(last=False)

    def clear(self) -> None:
        self._keys.clear()

    def __len__(self) -> int:
        return len(self._keys)


@dataclass(eq=False)
class Replica:
    index: int
    address: str
    streamer: Any  # jina's GatewayStreamer, for this replica alone
    load: Load = field(default_factory=Load)
    routed: int = 0  # requests routed to it since its last report
    streams: int = 0  # its streams open through this gateway
    reachable: bool = False  # its last report (or call) got through: not before its first
    cache: BlockCache = field(default_factory=BlockCache)
    chosen: int = 0  # requests routed to it, in all

    @property
    def serving(self) -> bool:
        """It takes new work: reachable and not draining."""
        return self.reachable and not self.load.draining

    @property
    def busy(self) -> int:
        """Its requests: as it reported them (every gateway's), or the streams this gateway holds
        open to it if more (its report lags a burst), and those sent to it since its report."""
        return max(self.load.running + self.load.waiting, self.streams) + self.routed

    async def unary(self, endpoint: str, timeout: float = 10.0) -> str:
        """The `text` of its answer on a unary endpoint (/stats, /metrics, /info, /tokenizer)."""
        docs = DocList[PromptDocument]([PromptDocument()])

        async def first() -> str:
            async for result in self.streamer.stream_docs(docs, exec_endpoint=endpoint,
                                                          return_type=DocList[ModelOutputDocument]):
                return result[0].text
            raise RuntimeError(f"no answer from {endpoint}")
        return await asyncio.wait_for(first(), timeout)

    async def report(self) -> None:
        """Its load, asked for. A replica that cannot be reached takes no work until it answers
        again; one that is only slow to answer (busy) keeps its last report."""
        try:
            stats = json.loads(await self.unary("/stats", timeout=15.0))
        except TimeoutError:
            return
        except UNREACHABLE as exc:  # gone, starting, restarting: not taking work
            if self.reachable:
                log.warning("replica %d (%s) does not answer: %s", self.index, self.address, exc)
            self.reachable = False
            return
        except Exception:  # noqa: BLE001 - it answers, but has no /stats (an executor of another kind)
            stats = {"steps": self.load.steps}
        steps = stats.get("steps", 0)
        if self.load.at and steps < self.load.steps:
            log.info("replica %d (%s) restarted: its cache is empty", self.index, self.address)
            self.cache.clear()
        used, total = stats.get("kv_blocks_used", 0), stats.get("kv_blocks", 0) or 1
        self.load = Load(stats.get("running", 0), stats.get("waiting", 0), used / total,
                         bool(stats.get("draining")), steps, time.monotonic())
        self.cache.capacity = max(1, total)
        self.reachable, self.routed = True, 0

    def lost(self) -> None:
        """A call to it failed as a connection fails: no new work until it reports again."""
        self.reachable = False

    def describe(self) -> dict:
        return {"replica": self.index, "address": self.address, "reachable": self.reachable,
                "draining": self.load.draining, "running": self.load.running, "waiting": self.load.waiting,
                "kv_used": round(self.load.kv_used, 4), "streams": self.streams, "routed_total": self.chosen,
                "predicted_blocks": len(self.cache)}


GENERATION = "llm"  # the Flow's first generating deployment (flows/llm.yml), whose model answers by default


def deployments(addresses_json: str) -> dict[str, list[str]]:
    """Each deployment's replicas' addresses, from Jina's `deployments_addresses`."""
    out = {}
    for name, found in json.loads(addresses_json or "{}").items():
        if isinstance(found, dict):
            found = found.get("grpc", [])
        out[name] = [found] if isinstance(found, str) else list(found)
    return out


def generation_deployments(addresses_json: str) -> list[tuple[str, list[str]]]:
    """(name, its replicas' addresses) of each generating deployment, one per model: every one but
    those that serve other endpoints (the embedder), `llm` first, the rest in the Flow's order."""
    found = deployments(addresses_json)
    names = [name for name in found if name not in DEPLOYMENT_OF.values()]
    names.sort(key=lambda name: name != GENERATION)
    return [(name, found[name]) for name in names]


def one_node_graph(deployment: str) -> dict[str, list[str]]:
    """A Jina topology of one deployment: a streamer built on it sends only there."""
    return {"start-gateway": [deployment], deployment: ["end-gateway"]}
