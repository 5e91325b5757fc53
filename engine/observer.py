"""What the engine tells an observer about each request's life, for metrics.

The engine stays free of any metrics library: it calls these hooks on its decode thread,
with times from `time.perf_counter`, and the executor turns them into Prometheus series
(executors/metrics.py). The default observer does nothing.
"""
from typing import Optional

from contract import FinishReason


class EngineObserver:
    def admitted(self, queued_seconds: float) -> None:
        """A request left the waiting queue for the batch."""

    def prefilled(self, prompt_tokens: int, cached_tokens: Optional[int] = None) -> None:
        """A request's prompt is in the cache, `cached_tokens` of it from the prefix cache
        (None where no prefix cache was looked at)."""

    def preempted(self) -> None:
        """A row gave its KV blocks back (the pool ran out); it computes its history again later."""

    def speculated(self, drafted: int, accepted: int) -> None:
        """A speculating row's step: its drafts, and how many the chosen tokens confirmed."""

    def token(self, first: bool, since_previous_seconds: float) -> None:
        """A token was generated: the first (since arrival: time to first token) or a next
        one (since the previous: inter-token latency)."""

    def finished(self, reason: Optional[FinishReason], e2e_seconds: float) -> None:
        """A request ended: length, eos_token, stop_sequence, aborted or error."""
