"""Which replica serves a request: on prefix and load together (SGLang's cache-aware router, the
Gateway API Inference Extension's endpoint picker), or in turn (round robin, for comparison).

Cache-aware, in this order:
1. imbalance: when the busiest serving replica has more than `balance_abs` requests over the
   idlest and more than `balance_rel` times as many, the least busy takes it (llm-d saw routing on
   prefix alone overload replicas: affinity always has a load guard);
2. affinity: the replica predicted to hold the longest run of the request's prefix-cache keys, when
   that run is at least `min_match` of them (a conversation's next turn, a shared system prompt);
   among equals, the least busy;
3. otherwise the least busy, in turn among equals.
The chosen replica is then predicted to hold the request's keys: a session's later turns follow it.
"""
import enum
import itertools
from dataclasses import dataclass
from typing import Optional

from gateway.config import GatewayConfig, config

from .replicas import Replica


class Policy(enum.StrEnum):
    CACHE_AWARE = "cache-aware"
    ROUND_ROBIN = "round-robin"


class NoReplica(RuntimeError):
    """No replica takes work: every one is unreachable or draining."""


@dataclass
class Thresholds:
    balance_abs: int = GatewayConfig.balance_abs  # requests
    balance_rel: float = GatewayConfig.balance_rel
    min_match: float = GatewayConfig.min_match  # of the request's keys

    @classmethod
    def from_config(cls) -> "Thresholds":
        settings = config()
        return cls(settings.balance_abs, settings.balance_rel, settings.min_match)


class Router:
    def __init__(self, replicas: list[Replica], policy: Policy = Policy.CACHE_AWARE,
                 thresholds: Optional[Thresholds] = None):
        self.replicas, self.policy = replicas, policy
        self.thresholds = thresholds or Thresholds()
        self._turn = itertools.count()
        self.reasons = {"imbalance": 0, "affinity": 0, "least_busy": 0, "round_robin": 0}

    def pick(self, keys: list[int], exclude: frozenset[Replica] = frozenset(), count: bool = True) -> Replica:
        """The replica for a request with these prefix-cache keys (not one of `exclude`); `count`:
        a request that generates (not a question to one replica, /info, say)."""
        live = [r for r in self.replicas if r.serving and r not in exclude]
        if not live:
            raise NoReplica("no replica takes work now: every one is unreachable or draining")
        reason, chosen = self._choose(live, keys)
        if not count:
            return chosen
        self.reasons[reason] += 1
        chosen.cache.add(keys)
        chosen.routed += 1
        chosen.chosen += 1
        return chosen

    def _choose(self, live: list[Replica], keys: list[int]) -> tuple[str, Replica]:
        if self.policy is Policy.ROUND_ROBIN:
            return "round_robin", live[next(self._turn) % len(live)]
        busiest, idlest = max(r.busy for r in live), min(r.busy for r in live)
        t = self.thresholds
        if busiest - idlest > t.balance_abs and busiest > t.balance_rel * idlest:
            return "imbalance", self._least_busy(live)
        matches = {r: r.cache.match(keys) for r in live}
        best = max(matches.values())
        if keys and best and best >= t.min_match * len(keys):
            return "affinity", self._least_busy([r for r in live if matches[r] == best])
        return "least_busy", self._least_busy(live)

    def _least_busy(self, replicas: list[Replica]) -> Replica:
        idlest = min(r.busy for r in replicas)
        ties = [r for r in replicas if r.busy == idlest]
        return ties[next(self._turn) % len(ties)]

    def describe(self) -> dict:
        return {"policy": str(self.policy), "replicas": len(self.replicas), "reasons": dict(self.reasons),
                "thresholds": vars(self.thresholds)}
