"""Admission control: who waits, who runs, and when to say 'overloaded'.

Requests reserve their worst-case KV length (prompt + max_tokens) on admission, as
TGI's max_batch_total_tokens does, so a running request can never run out of room. The
batch is left-padded to its longest row, so what is admitted is bounded by
rows x the longest reservation, not by the sum. A request with n answers counts n rows
from admission on: its prompt is prefilled once, then each answer decodes in a row.
"""
import collections
import threading
from collections.abc import Sequence

from contract import EngineConfig, EngineDeadError, OverloadedError, ValidationError

from .request import Request, RequestState


class Scheduler:
    def __init__(self, config: EngineConfig):
        self.config = config
        self._lock = threading.Lock()
        self._waiting: collections.deque[Request] = collections.deque()
        self.prefilling: list[Request] = []  # admitted, prompt not fully in cache yet
        self.running: dict[str, Request] = {}  # rows of the decode batch
        self.reserved = 0  # sum of reservations, for stats
        self.closed = False

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def has_work(self) -> bool:
        return bool(self._waiting or self.prefilling or self.running)

    def check_fits(self, row_tokens: int, rows: int = 1) -> None:
        """A request that could never be admitted, even alone, is refused naming the field."""
        budget = self.config.max_batch_tokens
        if row_tokens > budget:
            raise ValidationError("max_tokens", (
                f"prompt + max_tokens = {row_tokens} tokens exceeds the server's "
                f"batch token budget of {budget}"))
        if rows > self.config.max_running:
            raise ValidationError("n", f"{rows} answers need {rows} batch rows; the server runs at most "
                                       f"{self.config.max_running} together")
        if rows * row_tokens > budget:
            raise ValidationError("n", f"{rows} answers x (prompt + max_tokens = {row_tokens} tokens) exceeds "
                                       f"the server's batch token budget of {budget}")

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

    def remove_waiting(self, request_id: str) -> Request | None:
        with self._lock:
            for req in self._waiting:
                if req.request_id == request_id:
                    self._waiting.remove(req)
                    return req
        return None

    def admit(self) -> list[Request]:
        """Move waiting requests into prefill, first come first served, while they fit;
        return those admitted."""
        admitted = []
        with self._lock:
            while self._waiting:
                head = self._waiting[0]
                active = len(self.running) + sum(r.rows for r in self.prefilling)
                if active + head.rows > self.config.max_running:
                    break
                if not self._fits(head):
                    break
                self._waiting.popleft()
                self.reserved += head.reserved_tokens
                head.state = RequestState.PREFILLING
                self.prefilling.append(head)
                admitted.append(head)
        return admitted

    def _fits(self, head: Request) -> bool:
        """The padded batch with `head` in it stays within the KV budget."""
        active = self.prefilling + list(self.running.values()) + [head]
        return sum(r.rows for r in active) * max(r.row_tokens for r in active) <= self.config.max_batch_tokens

    def start_running(self, request: Request, answers: Sequence[Request] = ()) -> None:
        """Its prompt is in the cache: it decodes with the batch from now on, and so do its
        other answers (n > 1), which take over the rows it reserved for them."""
        request.prefilled = len(request.prompt_ids)
        self.prefilling.remove(request)
        request.rows = 1
        for req in [request, *answers]:
            self.running[req.row_id] = req
            req.state = RequestState.RUNNING

    def release(self, request: Request) -> None:
        """Forget a finished request, wherever it was, and free its reservation."""
        admitted = request in self.prefilling or self.running.get(request.row_id) is request
        if admitted:
            self.reserved -= request.reserved_tokens
        if request in self.prefilling:
            self.prefilling.remove(request)
        if admitted:
            self.running.pop(request.row_id, None)
        request.state = RequestState.FINISHED
        request.cache = None

    def drain_waiting(self, close: bool = False) -> list[Request]:
        """Take every waiting request out; with close, refuse new ones from now on."""
        with self._lock:
            self.closed = self.closed or close
            drained = list(self._waiting)
            self._waiting.clear()
        return drained


def plan_prefill(prefilling: list[Request], budget: int) -> list[list[Request]]:
    """Groups of fresh prompts to prefill together this step, within `budget` padded tokens.

    Prompts are sorted by length and a group only takes prompts at most a quarter longer
    than its shortest: padding is compute spent on nothing. Prompts longer than the whole
    budget are left to chunked prefill.
    """
    fresh = sorted((r for r in prefilling if r.prefilled == 0 and len(r.prompt_ids) <= budget),
                   key=lambda r: len(r.prompt_ids))
    groups: list[list[Request]] = []
    left = budget
    for req in fresh:
        width = len(req.prompt_ids)
        group = groups[-1] if groups else None
        if group and width <= max(len(group[0].prompt_ids) * 5 // 4, len(group[0].prompt_ids) + 8) \
                and len(group) * (width - len(group[-1].prompt_ids)) + width <= left:
            left -= len(group) * (width - len(group[-1].prompt_ids)) + width
            group.append(req)
        elif width <= left:
            left -= width
            groups.append([req])
        else:
            break
    return groups
