"""Admission, each step's work, and the one writer of row state (vLLM v1's Scheduler:
`schedule`, then `update_from_output`).

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
admission on (request.py's ParentRequest): its prompt is computed once, then each answer decodes
in a row of its own.

`update` is where a step's outcome becomes row state: tokens, computed counts and the blocks they
key, accepted drafts, answers fanned out, finished rows released. Nothing else in the engine
writes a row's state (ROW_STATE; a test checks).
"""
import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Optional

from contract import EngineConfig, EngineDeadError, OverloadedError, ValidationError

from ..outputs import RequestOutput
from ..policies.speculation import StepCosts, worth
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


@dataclass
class RowOutcome:
    """What one step did for one row, as `update` applies it and `emit` reports it."""

    row: Request
    kept: int = 0  # tokens of its history computed and kept: its work's, then the drafts accepted
    tokens: list[int] = field(default_factory=list)  # tokens it generated, in order
    outputs: list[RequestOutput] = field(default_factory=list)  # what its reader gets, in order
    ends: bool = False  # finished or failed: its blocks go back
    forked_from: Optional[Request] = None  # an answer fanning out of this row (after it, in the list)
    drafted: int = 0  # speculation: drafts checked this step
    prefilled: bool = False  # its prompt was computed through this step


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
        self.costs = StepCosts()  # decode steps' seconds by size: what drafts cost here
        self._decode_plan: Optional[tuple[int, float]] = None  # the last plan's positions and start, if decode only

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

    # ----- requests in (any thread) -----
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
        """Called from any thread; fails at once instead of queueing without bound. `max_waiting`
        counts the requests queued behind the running ones: those that arrived since the last step
        while batch rows are free start at the next step, and queue behind nobody (two requests
        arriving together at an idle server with max_waiting 1 were refused one of them)."""
        self.check_fits(request.row_tokens, request.rows)
        with self._lock:
            if self.closed:
                raise EngineDeadError("the engine is shutting down")
            free = max(0, self.config.max_running - sum(r.rows for r in self.running))
            if len(self._waiting) >= self.config.max_waiting + free:
                raise OverloadedError(
                    f"overloaded: {len(self._waiting) - free} requests already waiting, retry later")
            self._waiting.append(request)

    # ----- one step: the work -----
    def schedule(self) -> StepPlan:
        plan, budget = StepPlan(), self.config.max_prefill_tokens
        preempted = False
        speculate = len(self.running) <= self.config.speculative_max_rows
        positions = decoding = sum(1 for r in self.running if r.state is RequestState.RUNNING and r.todo == 1)
        for req in list(self.running):
            if req.state is not RequestState.RUNNING:  # preempted for an older row this step
                continue
            todo = req.todo
            count = 1 if todo == 1 else min(todo, budget)
            if count == 0:
                continue
            drafts = self._drafts(req, positions, decoding) if todo == 1 and speculate else []
            positions += len(drafts)
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
        decode_only = plan.work and all(w.count == 1 and w.start > 0 for w in plan.work)
        self._decode_plan = (sum(w.tokens for w in plan.work), time.perf_counter()) if decode_only else None
        return plan

    def _drafts(self, req: Request, positions: int, decoding: int) -> list[int]:
        """A decoding row's drafts, no more than the tokens it may still generate after the next,
        and, where it adapts, no more than pay in a step of `positions` without them whose
        `decoding` rows all wait for them."""
        room = min(req.speculative, req.params.max_tokens - len(req.generated) - 1)
        if req.drafter is None or room <= 0:
            return []
        drafts = req.drafter.propose(req.history(), room)
        if req.adaptive and drafts:
            drafts = drafts[:worth(len(drafts), req.acceptance.rate(), lambda k: self.costs.ratio(positions, k),
                                   decoding)]
        return drafts

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
                if not self._start(req, prefix, count):
                    break
                self._waiting.remove(req)
                if req.state is RequestState.WAITING:
                    # of its prompt: a continued answer's own tokens can be cached too
                    for row in [req, *(req.parent.children if req.parent is not None else [])]:
                        row.cached_tokens = min(req.computed, len(req.prompt_ids))
                    self.kv.count_lookup(req, req.computed)
                    plan.admitted.append(req)
                req.state = RequestState.RUNNING
                self.running.append(req)
                plan.work.append(Work(req, req.computed, count))
                computing |= self.kv.computing([req])
                budget -= count

    def _start(self, req: Request, prefix: list[int], count: int) -> bool:
        """Its blocks, and those its answers will fork into when its prompt's last block is partial."""
        forks = req.rows - 1 if len(req.prompt_ids) % self.kv.block_size else 0
        reserved = self.kv.start(req, prefix, count, forks)
        if reserved is None:
            return False
        if req.parent is not None:
            req.parent.reserved = reserved
        req.computed = len(prefix) * self.kv.block_size
        return True

    def _preempt(self, req: Request) -> None:
        """Out of blocks: the row gives its blocks back and waits at the head of the queue."""
        self.running.remove(req)
        self._free(req)
        req.computed = 0
        req.state = RequestState.PREEMPTED
        self.preemptions += 1
        self.on_preempt()
        with self._lock:
            self._waiting.appendleft(req)

    # ----- one step: its outcome (the one writer of row state) -----
    def update(self, outcomes: list[RowOutcome]) -> None:
        """A step's outcome, row by row: answers fan out of their row (which comes first), tokens
        join the history, computed tokens key their blocks; then the rows that ended go. A decode
        step's time since it was planned (its forward pass and choices) is what its size costs."""
        if self._decode_plan is not None:
            positions, started = self._decode_plan
            self.costs.record(positions, time.perf_counter() - started)
        for outcome in outcomes:
            row = outcome.row
            if outcome.forked_from is not None:
                self._fork(outcome.forked_from, row)
            before = row.computed
            if outcome.drafted:
                row.acceptance.record(outcome.drafted, max(0, len(outcome.tokens) - 1))
            row.generated += outcome.tokens
            row.computed += outcome.kept
            self.kv.computed(row, before)
        for outcome in outcomes:
            if outcome.ends:
                self.release(outcome.row)

    def _fork(self, parent: Request, child: Request) -> None:
        """An answer starts from its parent's computed prompt, in a block reserved for it."""
        assert parent.parent is not None
        reserved = parent.parent.reserved.pop() if parent.parent.reserved else None
        self.kv.fork(parent, child, reserved)
        parent.parent.children.remove(child)
        child.computed = parent.computed
        child.state = RequestState.RUNNING
        self.running.append(child)

    def abort(self, request_ids: set[str]) -> list[Request]:
        """Every row of these requests, waiting or running, gone; returns them."""
        with self._lock:
            gone = [r for r in self._waiting if r.request_id in request_ids]
        gone += [r for r in self.running if r.request_id in request_ids]
        for req in gone:
            self.release(req)
        return gone

    def release(self, request: Request) -> None:
        """Forget a row that ended, wherever it was, and give its blocks back (and those its
        answers would have forked into, had it not ended before they fanned out)."""
        with self._lock:
            if request in self._waiting:
                self._waiting.remove(request)
        if request in self.running:
            self.running.remove(request)
        self._free(request)
        if request.parent is not None:
            request.parent.children.clear()
        request.state = RequestState.FINISHED

    def _free(self, req: Request) -> None:
        self.kv.free(req)
        if req.parent is not None and req.parent.reserved:
            self.kv.release(req.parent.reserved)
            req.parent.reserved = []

    def fail_all(self, close: bool = False) -> list[Request]:
        """Every row in flight gone and the pool emptied (the loop itself failed: trust nothing);
        with close, new requests are refused from now on. Returns the rows."""
        with self._lock:
            self.closed = self.closed or close
            rows = list(self._waiting) + self.running
            self._waiting.clear()
        self.running = []
        for req in rows:
            req.state = RequestState.FINISHED
        self.kv.reset()
        return rows
