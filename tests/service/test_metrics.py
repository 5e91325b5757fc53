"""Prometheus metrics under vLLM's names, read with one GET after known requests."""
import asyncio

import requests
from prometheus_client.parser import text_string_to_metric_families

from client import StreamError, generate

NAMES = ["vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds", "vllm:e2e_request_latency_seconds",
         "vllm:request_queue_time_seconds", "vllm:num_requests_running", "vllm:num_requests_waiting",
         "vllm:kv_cache_usage_perc", "vllm:prompt_tokens", "vllm:generation_tokens", "vllm:request_success",
         "vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:num_preemptions", "vllm:spec_decode_num_drafts",
         "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens"]


def scrape(http_port: int) -> dict[tuple, float]:
    r = requests.get(f"http://127.0.0.1:{http_port}/metrics", timeout=30)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(r.text) for s in family.samples}


def value(samples: dict, name: str, **labels) -> float:
    return sum(v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= set(ls))


async def test_metrics_count_known_requests(flow):
    grpc_port, http_port = flow
    before = scrape(http_port)
    results = await asyncio.gather(*(generate(p, port=grpc_port, max_tokens=5)
                                     for p in ("the quick", "brown fox jumps", "a lazy dog")))
    try:
        await generate("x", port=grpc_port, max_tokens=0)  # refused before the engine: not counted
    except StreamError:
        pass
    after = scrape(http_port)
    exposed = {n for n, _ in after}
    for name in NAMES:  # histograms as _count/_sum/_bucket, counters as _total, gauges as they are
        assert exposed & {name, name + "_total", name + "_count"}, name
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}

    def d(name: str, **labels) -> float:
        return value(delta, name, **labels)
    generated = sum(r.generated_tokens for r in results)
    assert d("vllm:generation_tokens_total") == generated
    assert d("vllm:prompt_tokens_total") == sum(r.prompt_tokens for r in results)
    assert d("vllm:request_success_total", finished_reason="length") == sum(
        r.finish_reason == "length" for r in results)
    assert d("vllm:request_success_total") == 3
    for name in ("vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds",
                 "vllm:request_queue_time_seconds"):
        assert d(name + "_count") == 3, name
    assert d("vllm:inter_token_latency_seconds_count") == generated - 3
    assert value(after, "vllm:num_requests_running") == 0 and value(after, "vllm:num_requests_waiting") == 0
    assert value(after, "vllm:kv_cache_usage_perc") == 0
    assert all(dict(ls).get("model_name") == "gpt2" for (n, ls) in after if n.startswith("vllm:"))
