"""Admission, and each step's work: which rows compute how many tokens (vLLM v1's scheduler).

Every row, prefilling or decoding, is one thing: a history (its prompt, then the tokens it
generated) of which `computed` tokens have their keys and values in the pool. A step computes
the rest of each row's history, or a chunk of it: decoding rows their last token, prompts up to
max_prefill_tokens in all, so that running streams keep their pace. A row whose work reaches the
end of its history chooses its next token from that step's logits.

Admission counts real tokens: a request starts once the pool has blocks for its first chunk after
its cached prefix, then grows block by block. When blocks run out mid-generation, the most
recently admitted row is preempted, as vLLM does: its blocks go back, it waits at the head of the
queue, and when it starts again it recomputes its history (mostly found in the prefix cache) and
goes on where it was; its stream only pauses. A request that could never fit, even alone, is
refused before any token, naming the field. A request with n answers counts n rows from
admission on: its prompt is computed once, then each answer decodes in a row of its own.
"""
import collections
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from contract import EngineConfig, EngineDeadError, OverloadedError, ValidationError

from .kv_manager import KVCacheManager
from .request import Request, RequestState


@dataclass
class Work:
    """One row's share of a step: tokens start..start + count of its history, then its drafts
    (speculation.py), whose logits check them."""

    request: Request
    start: int
    count: int
    drafts: list[int] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        """Positions computed: the history's, then the drafts'."""
        return self.count + len(self.drafts)

    @property
    def samples(self) -> bool:
        """It reaches the end of the history: the step's logits choose the row's next token."""
        return self.start + self.count == self.request.length


@dataclass
class StepPlan:
    work: list[Work] = field(default_factory=list)
    admitted: list[Request] = field(default_factory=list)  # started for the first time


class Scheduler:
    def __init__(self, config: EngineConfig, kv: KVCacheManager, on_preempt: Callable[[], None] = lambda: None):
        self.config = config
        self.kv = kv
        self.on_preempt = on_preempt  # metrics
        self._lock = threading.Lock()
        self._waiting: collections.deque[Request] = collections.deque()
        self.running: list[Request] = []  # rows holding blocks, oldest admission first
        self.preemptions = 0
        self.closed = False

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def has_work(self) -> bool:
        return bool(self._waiting or self.running)

    @property
    def prefilling(self) -> list[Request]:
        """Running rows with more than their last token to compute."""
        return [r for r in self.running if r.todo > 1]

    def check_fits(self, row_tokens: int, rows: int = 1) -> None:
        """A request that could never run, even alone, is refused naming the field."""
        size, blocks = self.kv.block_size, self.kv.blocks.total
        row_blocks = -(-row_tokens // size)
        if row_blocks > blocks:
            raise ValidationError("max_tokens", (
                f"prompt + max_tokens = {row_tokens} tokens exceeds the server's KV cache of "
                f"{self.kv.capacity} tokens (max_batch_tokens)"))
        if rows > self.config.max_running:
            raise ValidationError("n", f"{rows} answers need {rows} batch rows; the server runs at most "
                                       f"{self.config.max_running} together")
        if rows * row_blocks > blocks:
            raise ValidationError("n", f"{rows} answers x (prompt + max_tokens = {row_tokens} tokens) exceeds "
                                       f"the server's KV cache of {self.kv.capacity} tokens (max_batch_tokens)")

    def submit(self, request: Request) -> None:
        """Called from any thread; fails at once instead of queueing without bound."""
        self.check_fits(request.row_tokens, request.rows)
        with self._lock:
            if self.closed:
                raise EngineDeadError("the engine is shutting down")
            if len(self._waiting) >= self.config.max_waiting:
                raise OverloadedError(
                    f"overloaded: {len(self._waiting)} requests already waiting, retry later")
            self._waiting.append(request)

    def remove_waiting(self, request_id: str) -> list[Request]:
        """Every row of the request that waits (a preempted answer among them)."""
        with self._lock:
            gone = [r for r in self._waiting if r.request_id == request_id]
            for req in gone:
                self._waiting.remove(req)
        return gone

    # ----- one step -----
    def schedule(self) -> StepPlan:
        plan, budget = StepPlan(), self.config.max_prefill_tokens
        preempted = False
        speculate = len(self.running) <= self.config.speculative_max_rows
        for req in list(self.running):
            if req.state is not RequestState.RUNNING:  # preempted for an older row this step
                continue
            todo = req.todo
            count = 1 if todo == 1 else min(todo, budget)
            if count == 0:
                continue
            drafts = self._drafts(req) if todo == 1 and speculate else []
            while not self.kv.grow(req, count + len(drafts)):
                victim = self.running[-1]
                self._preempt(victim)
                preempted = True
                if victim is req:
                    break
            else:
                plan.work.append(Work(req, req.computed, count, drafts))
                budget -= count if todo > 1 else 0
        if not preempted:
            self._admit(plan, budget)
        return plan

    @staticmethod
    def _drafts(req: Request) -> list[int]:
        """A decoding row's drafts, no more than the tokens it may still generate after the next."""
        room = min(req.speculative, req.params.max_tokens - len(req.generated) - 1)
        if req.drafter is None or room <= 0:
            return []
        return req.drafter.propose(req.history(), room)

    def _admit(self, plan: StepPlan, budget: int) -> None:
        """Waiting requests start, first come first served, while rows, blocks and the
        step's prompt budget allow; those whose next block another row is computing wait for it."""
        if not self._waiting:
            return
        computing = self.kv.computing(self.running)
        with self._lock:
            for req in list(self._waiting):
                rows = sum(r.rows for r in self.running)
                if budget <= 0 or rows + req.rows > self.config.max_running:
                    break
                prefix = self.kv.cached_prefix(req)
                if self.kv.waits_for(req, prefix, computing):
                    continue
                count = min(req.length - len(prefix) * self.kv.block_size, budget)
                if not self.kv.start(req, prefix, count):
                    break
                self._waiting.remove(req)
                if req.state is RequestState.WAITING:
                    req.cached_tokens = req.computed
                    self.kv.count_lookup(req)
                    plan.admitted.append(req)
                req.state = RequestState.RUNNING
                self.running.append(req)
                plan.work.append(Work(req, req.computed, count))
                computing |= self.kv.computing([req])
                budget -= count

    def _preempt(self, req: Request) -> None:
        """Out of blocks: the row gives its blocks back and waits at the head of the queue."""
        self.running.remove(req)
        self.kv.free(req)
        req.computed = 0
        req.state = RequestState.PREEMPTED
        self.preemptions += 1
        self.on_preempt()
        with self._lock:
            self._waiting.appendleft(req)

    def preempt_latest(self, but: Request) -> None:
        """Make room for a running row: the latest other row gives its blocks back."""
        victims = [r for r in self.running if r is not but]
        if not victims:
            raise RuntimeError("the KV cache cannot hold one request's answers, which admission checked it could")
        self._preempt(victims[-1])

    def add_running(self, req: Request) -> None:
        """Another answer of a running request (n > 1), its blocks forked already."""
        req.state = RequestState.RUNNING
        self.running.append(req)

    def release(self, request: Request) -> None:
        """Forget a finished row, wherever it was (a preempted one waits), and free its blocks."""
        if request.state is RequestState.PREEMPTED:
            with self._lock:
                if request in self._waiting:
                    self._waiting.remove(request)
        if request in self.running:
            self.running.remove(request)
        self.kv.free(request)
        request.state = RequestState.FINISHED

    def drain_waiting(self, close: bool = False) -> list[Request]:
        """Take every waiting request out; with close, refuse new ones from now on."""
        with self._lock:
            self.closed = self.closed or close
            drained = list(self._waiting)
            self._waiting.clear()
        return drained
