"""The replicas one gateway process routes to, shared by its gRPC and HTTP servers: a streamer
per replica, the router, the replicas' reports polled in the background, the prefix keys, and
the unary endpoints that speak for all replicas at once (/stats, /metrics, /info).

`LLM_ROUTER` picks the policy: `cache-aware` (the default) or `round-robin`.
`LLM_ROUTER_POLL_MS` (500) is how often each replica reports its load; `LLM_ROUTER_WAIT_S` (15)
how long a request waits for a replica to take work when none does (a rolling restart).
"""
import asyncio
import json
import logging
import re
import time
from typing import Any, Optional

from contract.memory import give_back_freed
from gateway.config import config
from gateway.fleet.membership import Membership
from gateway.fleet.prefix_keys import PrefixKeys, TokenizerSpec
from gateway.fleet.replicas import Replica, generation_deployments, one_node_graph
from gateway.fleet.router import NoReplica, Policy, Router, Thresholds

log = logging.getLogger(__name__)
_SERIES = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?(?P<rest>\s.*)$")


class Fleet:
    _shared: dict[str, "Fleet"] = {}

    def __init__(self, members: Membership, policy: Policy):
        self.members = members
        self.replicas = members.initial()  # changed in place when members come and go
        replicas = self.replicas
        self.router = Router(replicas, policy, Thresholds.from_config())
        self.poll, self.wait = config().router_poll_s, config().router_wait_s
        self.migrations = 0
        self._keys: Optional[asyncio.Task] = None  # the tokenizer from a replica, then PrefixKeys
        self._poller: Optional[asyncio.Task] = None

    @classmethod
    def shared(cls, runtime_args: Any, logger: Any = None) -> list["Fleet"]:
        """The process's fleets for these runtime arguments (the gRPC and HTTP servers share them):
        one per generating deployment, the default model's first; none when there is none."""
        addresses = getattr(runtime_args, "deployments_addresses", "{}")
        fleets = []
        for name, replicas in generation_deployments(addresses):
            key = f"{addresses}/{name}"
            if key not in cls._shared:
                members = Membership(name, one_node_graph(name), replicas, logger)
                cls._shared[key] = cls(members, Policy(config().router))
            fleets.append(cls._shared[key])
        return fleets

    # ----- choosing -----
    async def pick(self, keys: list[int], exclude: frozenset[Replica], count: bool = True) -> Replica:
        """The router's choice; when no replica takes work now, ask those that do not for their
        reports at once, then again every 0.1 s (or LLM_ROUTER_POLL_MS, if less) up to `wait` seconds,
        then NoReplica. Asked at once: the first request after the start found no report yet (the
        poller starts with it) and waited 0.1 s for nothing, twice (its /info, then its stream)."""
        self._start_polling()
        deadline = time.monotonic() + self.wait
        asked = False
        while True:
            try:
                return self.router.pick(keys, exclude, count)
            except NoReplica:
                if time.monotonic() >= deadline or all(r in exclude for r in self.replicas):
                    raise
            if asked:
                await asyncio.sleep(min(self.poll, 0.1))
            asked = True
            await asyncio.gather(*(r.report() for r in self.replicas if not r.serving and r not in exclude))

    async def one(self, endpoint: str, timeout: float = 10.0) -> str:
        """A unary endpoint's answer from one replica (the least busy that answers)."""
        tried: set[Replica] = set()
        while True:
            replica = await self.pick([], frozenset(tried), count=False)
            try:
                return await replica.unary(endpoint, timeout)
            except Exception:  # noqa: BLE001 - gone meanwhile: another one answers
                replica.lost()
                tried.add(replica)

    async def keys(self, data: Any, adapter: Optional[str] = None) -> list[int]:
        """The request's prefix-cache keys (a LoRA adapter's own: `adapter_root`), once the tokenizer
        came from a replica (requests that come meanwhile wait for it); [] with one replica, round
        robin, or no tokenizer (routing then goes on load alone)."""
        if len(self.replicas) < 2 or self.router.policy is not Policy.CACHE_AWARE:
            return []
        self._fetch_keys()
        assert self._keys is not None
        try:
            keys = await asyncio.shield(self._keys)
        except Exception as exc:  # noqa: BLE001 - routing goes on load alone; the next request asks again
            log.warning("no tokenizer from the replicas (%s): routing on load alone", exc)
            self._keys = None
            return []
        prompt = data["prompt"].text if "prompt" in data else ""
        messages = data["messages"].text if "messages" in data else ""
        return keys.keys(prompt, messages, adapter)

    def _fetch_keys(self) -> None:
        async def fetch() -> PrefixKeys:
            keys = PrefixKeys(TokenizerSpec.from_json(await self.one("/tokenizer", 60)))
            give_back_freed()  # the tokenizer's parse: half of what it left resident
            return keys
        if self._keys is None:
            self._keys = asyncio.get_running_loop().create_task(fetch())

    # ----- reports -----
    def _start_polling(self) -> None:
        if self._poller is None or self._poller.done():
            self._poller = asyncio.get_running_loop().create_task(self._poll())

    async def _poll(self) -> None:
        while True:
            await self.members.refresh(self.replicas)
            await asyncio.gather(*(r.report() for r in self.replicas))
            if any(r.reachable for r in self.replicas) and len(self.replicas) > 1 \
                    and self.router.policy is Policy.CACHE_AWARE:
                self._fetch_keys()  # before the first request needs it
            await asyncio.sleep(self.poll)

    # ----- endpoints that speak for every replica -----
    async def unary(self, endpoint: str) -> Optional[str]:
        """/stats, /metrics and /info for the whole fleet; None for any other endpoint."""
        self._start_polling()
        if endpoint == "/stats":
            return json.dumps(await self._stats())
        if endpoint == "/metrics":
            return await self._metrics()
        if endpoint == "/info":
            info = json.loads(await self.one("/info"))
            return json.dumps({**info, "replicas": len(self.replicas), "routing": str(self.router.policy)})
        return None

    async def _stats(self) -> dict:
        replicas = list(self.replicas)  # as they are now: members may come and go meanwhile
        answers = await asyncio.gather(*(r.unary("/stats") for r in replicas), return_exceptions=True)
        each = [json.loads(a) if isinstance(a, str) else {"error": str(a)} for a in answers]
        total: dict[str, Any] = {}
        for stats in each:
            for key, value in stats.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    total[key] = total.get(key, 0) + value
        total["healthy"] = any(s.get("healthy", False) for s in each)  # the service answers
        return {**total, "replicas": [{**r.describe(), **s} for r, s in zip(replicas, each, strict=True)],
                "router": {**self.router.describe(), "migrations": self.migrations}}

    async def _metrics(self) -> str:
        """Every replica's series, each labelled with its replica."""
        replicas = list(self.replicas)
        answers = await asyncio.gather(*(r.unary("/metrics") for r in replicas), return_exceptions=True)
        return merge_families([(f'replica="{replica.index}"', text) for replica, text in zip(replicas, answers, strict=True)
                               if isinstance(text, str)])

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
        for replica in self.replicas:
            await replica.streamer.close()
        Fleet._shared = {k: v for k, v in Fleet._shared.items() if v is not self}


def merge_families(texts: list[tuple[str, str]]) -> str:
    """Prometheus texts as one, family by family (a family's HELP and TYPE once, then its samples
    from every text, as the text format wants); each (labels, text) has `labels` put first in its
    samples' labels ("" for none)."""
    families: dict[str, list[str]] = {}  # a family's HELP and TYPE lines, then its samples
    for labels, text in texts:
        family = ""
        for line in text.splitlines():
            if line.startswith("# "):
                family = line.split()[2] if len(line.split()) > 2 else family
                head = families.setdefault(family, [])
                if line not in head:
                    head.append(line)
            elif (match := _SERIES.match(line)) is not None:
                joined = ",".join(filter(None, [labels, match["labels"]]))
                series = f"{match['name']}{{{joined}}}" if joined else match["name"]
                families.setdefault(family, []).append(f"{series}{match['rest']}")
    return "\n".join(line for lines in families.values() for line in lines) + "\n"
