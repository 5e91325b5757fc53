"""Prometheus metrics under vLLM's names, so that existing dashboards work.

The executor is where every protocol meets, so the engine's observer hooks feed these
series here. `/metrics` on the gateway's HTTP port shows them (through the executor's
unary /metrics endpoint); in a cluster, set LLM_METRICS_PORT and every executor pod
serves them itself for scraping.
"""
from collections.abc import Callable
from typing import Optional

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, start_http_server

from contract import FinishReason
from engine import EngineObserver

# vLLM's buckets
TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0)
ITL = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0)
LOAD = (0.1, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)
REQUEST = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0)
# vLLM's finished_reason values: stop, length, abort (an error counts as an abort there too)
FINISHED = {FinishReason.EOS: "stop", FinishReason.STOP: "stop", FinishReason.LENGTH: "length",
            FinishReason.ABORTED: "abort", FinishReason.ERROR: "abort", FinishReason.TOOL_CALLS: "stop"}


class Metrics(EngineObserver):
    def __init__(self, model_name: str, stats: Callable[[], dict]):
        self.registry = CollectorRegistry()
        labels, r = {"model_name": model_name}, self.registry

        def histogram(name: str, doc: str, buckets: tuple) -> Histogram:
            return Histogram(name, doc, ["model_name"], buckets=buckets, registry=r).labels(**labels)

        self.ttft = histogram("vllm:time_to_first_token_seconds", "Time to first token.", TTFT)
        self.itl = histogram("vllm:inter_token_latency_seconds", "Time between two tokens of a request.", ITL)
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "Arrival to last token.", REQUEST)
        self.queue = histogram("vllm:request_queue_time_seconds", "Time waiting for a batch slot.", REQUEST)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prompt tokens prefilled.", ["model_name"],
                                     registry=r).labels(**labels)
        self.generation_tokens = Counter("vllm:generation_tokens", "Tokens generated.", ["model_name"],
                                         registry=r).labels(**labels)
        self.prefix_queries = Counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
                                      ["model_name"], registry=r).labels(**labels)
        self.prefix_hits = Counter("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache.",
                                   ["model_name"], registry=r).labels(**labels)
        self.preemptions = Counter("vllm:num_preemptions", "Rows that gave their KV blocks back to be recomputed.",
                                   ["model_name"], registry=r).labels(**labels)
        spec = {name: Counter(f"vllm:spec_decode_{name}", doc, ["model_name"], registry=r).labels(**labels)
                for name, doc in (("num_drafts", "Steps in which a row checked drafts (prompt lookup)."),
                                  ("num_draft_tokens", "Draft tokens checked."),
                                  ("num_accepted_tokens", "Draft tokens that the chosen tokens confirmed."))}
        self.spec_drafts, self.spec_draft_tokens, self.spec_accepted = spec.values()
        self.success = Counter("vllm:request_success", "Finished requests, by finish reason.",
                               ["model_name", "finished_reason"], registry=r)
        self.load_wait = histogram("llm:model_load_wait_seconds",
                                   "Time a request waited for its model to load (after its keep-alive unloaded it).",
                                   LOAD)
        self.load_stage = Gauge("llm:model_load_stage_seconds", "The model's last load, stage by stage: spawn, "
                                "imports, load, engine, handover, total (spare: 1 when a spare engine process "
                                "was taken).", ["model_name", "stage"], registry=r)
        self.model_name = model_name
        gauges = {"vllm:num_requests_running": ("Requests in the batch (decoding or prefilling).",
                                                lambda: stats()["running"]),
                  "vllm:num_requests_waiting": ("Requests queued for a batch slot.", lambda: stats()["waiting"]),
                  "vllm:kv_cache_usage_perc": ("Share of the KV cache's blocks held by running rows, 0 to 1.",
                                               lambda: _usage(stats()))}
        for name, (doc, read) in gauges.items():
            Gauge(name, doc, ["model_name"], registry=r).labels(**labels).set_function(read)

    def load_waited(self, seconds: float) -> None:
        """A request waited this long for its model's load."""
        self.load_wait.observe(seconds)

    def loaded(self, stages: dict[str, float]) -> None:
        """The model loaded: its start's stages (none for an engine on a thread of this process)."""
        for stage, seconds in stages.items():
            if stage != "imports_done":
                self.load_stage.labels(model_name=self.model_name, stage=stage).set(seconds)

    # the engine's hooks, on its decode thread (prometheus_client is thread-safe)
    def admitted(self, queued_seconds: float) -> None:
        self.queue.observe(queued_seconds)

    def prefilled(self, prompt_tokens: int, cached_tokens: Optional[int] = None) -> None:
        self.prompt_tokens.inc(prompt_tokens)
        if cached_tokens is not None:
            self.prefix_queries.inc(prompt_tokens)
            self.prefix_hits.inc(cached_tokens)

    def preempted(self) -> None:
        self.preemptions.inc()

    def speculated(self, drafted: int, accepted: int) -> None:
        self.spec_drafts.inc()
        self.spec_draft_tokens.inc(drafted)
        self.spec_accepted.inc(accepted)

    def token(self, first: bool, since_previous_seconds: float) -> None:
        self.generation_tokens.inc()
        (self.ttft if first else self.itl).observe(since_previous_seconds)

    def finished(self, reason: Optional[FinishReason], e2e_seconds: float) -> None:
        if reason is None:
            return
        self.e2e.observe(e2e_seconds)
        self.success.labels(model_name=self.model_name, finished_reason=FINISHED[reason]).inc()

    def text(self) -> str:
        """The Prometheus text exposition format."""
        return generate_latest(self.registry).decode()

    def serve(self, port: int) -> None:
        """Its own HTTP endpoint (any path), for a scraper that reaches this process."""
        start_http_server(port, registry=self.registry)


def _usage(stats: dict) -> float:
    return stats["kv_blocks_used"] / max(1, stats["kv_blocks"])
