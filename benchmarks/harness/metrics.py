"""Per-request timings and their summary, as vLLM's serving benchmark defines them.

- TTFT: request sent -> first streamed document received.
- E2E latency: request sent -> stream closed.
- TPOT: (E2E - TTFT) / (output tokens - 1), per request with at least 2 tokens.
- ITL: gaps between consecutive streamed documents, pooled over all requests.
  A document that carries k tokens (the service coalesces tokens when its reader
  falls behind) contributes ONE gap, the time since the previous document, as
  vLLM does for an SSE chunk: ITL then describes what the reader experiences
  (fewer, larger gaps), while TPOT, from token counts, stays per token.
- Throughput: completed requests and all received output tokens per second of
  the level's wall clock (first request sent -> last stream closed).
Percentiles are numpy's linear p50/p99 over completed requests.
"""
import os
import time
from dataclasses import dataclass, field
from typing import Optional

import numpy as np


class Total(int):
    """Yielded by a transport that learns the exact output token count only at the end."""


@dataclass
class RequestRecord:
    prompt_chars: int
    start: float = field(default_factory=time.perf_counter)
    arrivals: list[float] = field(default_factory=list)  # one per streamed document
    tokens: int = 0
    end: Optional[float] = None
    error: Optional[str] = None

    def on_document(self, n_tokens: int) -> None:
        """A streamed document of n_tokens arrived now (a `Total` only corrects the count)."""
        if isinstance(n_tokens, Total):
            self.tokens = int(n_tokens)
            return
        self.arrivals.append(time.perf_counter())
        self.tokens += n_tokens

    def finish(self, error: Optional[str] = None) -> None:
        self.end = time.perf_counter()
        self.error = error

    @property
    def ok(self) -> bool:
        return self.end is not None and self.error is None and self.tokens > 0

    @property
    def ttft(self) -> float:
        return self.arrivals[0] - self.start

    @property
    def e2e(self) -> float:
        return self.end - self.start

    @property
    def tpot(self) -> Optional[float]:
        return (self.e2e - self.ttft) / (self.tokens - 1) if self.tokens > 1 else None

    @property
    def itls(self) -> list[float]:
        return [b - a for a, b in zip(self.arrivals, self.arrivals[1:], strict=False)]


def _pct(values: list[float], q: float) -> Optional[float]:
    return round(float(np.percentile(values, q)) * 1000, 2) if values else None


def summarize(records: list[RequestRecord], duration: float) -> dict:
    """One result row's numbers (milliseconds, per second)."""
    done = [r for r in records if r.ok]
    tokens = sum(r.tokens for r in records)
    documents = sum(len(r.arrivals) for r in records)
    ttft = [r.ttft for r in done]
    tpot = [t for t in (r.tpot for r in done) if t is not None]
    itl = [g for r in done for g in r.itls]
    e2e = [r.e2e for r in done]
    errors = [r.error for r in records if r.error]
    return {
        "requests": len(records), "completed": len(done), "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "ttft_p50_ms": _pct(ttft, 50), "ttft_p99_ms": _pct(ttft, 99),
        "tpot_p50_ms": _pct(tpot, 50), "tpot_p99_ms": _pct(tpot, 99),
        "itl_p50_ms": _pct(itl, 50), "itl_p99_ms": _pct(itl, 99),
        "e2e_p50_ms": _pct(e2e, 50), "e2e_p99_ms": _pct(e2e, 99),
        "req_s": round(len(done) / duration, 3) if duration > 0 else None,
        "output_tok_s": round(tokens / duration, 1) if duration > 0 else None,
        "tokens_per_request": round(tokens / len(records), 1) if records else None,
        "tokens_per_document": round(tokens / documents, 2) if documents else None,
        "duration_s": round(duration, 2),
    }


def cpu_per_token(before: dict[str, float], after: dict[str, float], tokens: int) -> dict[str, float]:
    """Where the CPU went: milliseconds of each role's CPU time per output token."""
    return {role: round(1000 * (after[role] - before.get(role, 0.0)) / tokens, 3)
            for role in after if tokens and role != "gone"}


def workload_row(system: str, workload: str, concurrency: int, records: list, duration: float, cut: bool) -> dict:
    """A workload's row of a benchmark's results (summarize's figures), printed as it is made."""
    row = {"system": system, "workload": workload, "concurrency": concurrency, **summarize(records, duration),
           "cut_short": cut, "loadavg_1m": round(os.getloadavg()[0], 2)}
    print(f"  {system} {workload} C={concurrency}: {row['completed']}/{row['requests']} ok, {row['output_tok_s']} "
          f"tok/s, TTFT p50 {row['ttft_p50_ms']} ms, TPOT p50 {row['tpot_p50_ms']} ms", flush=True)
    return row
