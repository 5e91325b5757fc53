"""One engine step, in named stages (vLLM v1's EngineCore.step): aborts, schedule, masks, run,
choose, update, emit.

Synchronous and single-threaded by design: the engine process (core_process.py) runs it, or
AsyncEngine on a thread of its own. The scheduler plans the work and is the one writer of row
state (`update`); each row's policies choose its tokens (sampling.py) and turn them into what
its reader sees (output.py). A failure inside one row ends that row alone; a failed forward pass
fails the rows in it; a failed step fails what is in flight and leaves an empty, working engine.
"""
import itertools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from typing import Optional

import torch

from contract import MAX_SPECULATIVE_TOKENS, EngineConfig, FinishReason

from ..messages import Prepared
from ..model.c_stack import layer_windows
from ..model.cuda_graphs import DecodeGraphs
from ..model.loader import LoadedModel
from ..model.model_runner import ModelRunner, StepResult
from ..observer import EngineObserver
from ..outputs import RequestOutput
from ..policies.logprobs import TokenTexts
from ..policies.masks import MaskFiller
from ..policies.output import Vocabulary
from ..policies.prompt_logprobs import score
from ..policies.sampling import Choice, greedy_choices
from ..policies.speculation import SpeculationCounts
from ..policies.structured import GrammarCompiler
from .kv_manager import KVCacheManager
from .kv_pool import KVPool, KVShape
from .request import Request
from .rows import RowFactory, row_output
from .scheduler import RowOutcome, Scheduler, StepPlan, Work

log = logging.getLogger(__name__)


def kv_pool_for(loaded: LoadedModel, config: EngineConfig) -> KVPool:
    """The KV pool the config sizes, with a window pool for the model's sliding-window layers
    sized for the rows that may run at once and one step's new tokens."""
    shape = KVShape.of(loaded.model.config, loaded.kv_dtype, layer_windows(loaded.model))
    step_tokens = config.max_prefill_tokens + MAX_SPECULATIVE_TOKENS * config.speculative_max_rows
    blocks, window_blocks = shape.blocks_for(config.max_batch_tokens, config.kv_cache_bytes, config.max_running,
                                             step_tokens)
    return KVPool(shape, blocks, loaded.device, window_blocks)


class EngineCore:
    def __init__(self, loaded: LoadedModel, config: EngineConfig):
        self.loaded, self.config, self.tokenizer = loaded, config, loaded.tokenizer
        pool = kv_pool_for(loaded, config)
        self.kv = KVCacheManager(pool, config.prefix_caching)
        self.scheduler = Scheduler(config, self.kv, lambda: self.observer.preempted())
        self.runner = ModelRunner(loaded, self.kv, DecodeGraphs.for_model(loaded, pool, config))
        self.runner.probe()
        self.grammars = GrammarCompiler(self.tokenizer, config.limits)
        self.token_texts = TokenTexts(self.tokenizer)
        vocab = Vocabulary.of(self.tokenizer, loaded.eos_token_ids, self.token_texts, config.reasoning)
        self.rows = RowFactory(config, vocab, self.grammars)
        self.masks = MaskFiller(self.grammars)
        self._aborts: set[str] = set()
        self._abort_lock = threading.Lock()
        self.steps = self.aborted = 0  # aborted: requests that left early because their reader went away
        self.loop_restarts = 0  # steps that failed as a whole (see safe_step)
        self.speculation = SpeculationCounts()
        self.observer = EngineObserver()  # metrics: the executor sets its own

    # ----- requests in (any thread) -----
    def add(self, request_id: str, prepared: Prepared, sink: Callable[[RequestOutput], None]) -> Request:
        """Queue a prepared request (prepare.py); raises, before any token, when it cannot be
        served: overloaded, beyond the KV cache, a grammar that does not compile."""
        row = self.rows.make(request_id, prepared, sink)
        self.scheduler.submit(row)
        return row

    def abort(self, request_id: str) -> None:
        """Thread-safe; the request leaves before the next forward pass."""
        with self._abort_lock:
            self._aborts.add(request_id)

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work or bool(self._aborts)

    def stats(self) -> dict:
        sched = self.scheduler
        return {"running": len(sched.running), "prefilling": len(sched.prefilling), "waiting": sched.num_waiting,
                "steps": self.steps, "aborted": self.aborted, "loop_restarts": self.loop_restarts,
                "preemptions": sched.preemptions, **self.kv.stats(), **asdict(self.speculation)}

    # ----- one step -----
    def safe_step(self) -> None:
        """A step whose failure fails what is in flight and leaves an empty, working engine."""
        try:
            self.step()
        except Exception as exc:
            log.exception("engine step failed; failing in-flight requests and restarting the loop")
            self.loop_restarts += 1
            self.fail_all(f"engine error: {type(exc).__name__}: {exc}")
            time.sleep(0.01)

    def step(self) -> None:
        self.steps += 1
        self._apply_aborts()
        plan = self.scheduler.schedule()
        self._observe_admitted(plan)
        if not plan.work:
            return
        masks = self._start_masks(plan)
        result = self._run(plan)
        outcomes = self._choose(plan, result, masks) if result is not None else self._failed(plan)
        self.scheduler.update(outcomes)
        self._emit(outcomes)

    # ----- aborts -----
    def _apply_aborts(self) -> None:
        with self._abort_lock:
            aborts, self._aborts = self._aborts, set()
        for row in self.scheduler.abort(aborts) if aborts else []:
            self.aborted += 1
            self.observer.finished(FinishReason.ABORTED, time.perf_counter() - row.arrival)

    def _observe_admitted(self, plan: StepPlan) -> None:
        now = time.perf_counter()
        for row in plan.admitted:
            self.observer.admitted(now - row.arrival)

    # ----- masks, run -----
    def _start_masks(self, plan: StepPlan) -> Optional[Future]:
        """The constrained rows' token masks, filled in llguidance's threads while the forward pass runs."""
        firsts = _logit_rows(plan)
        return self.masks.start([(first, w.request.pipeline.matcher) for w, first in zip(plan.work, firsts, strict=True)
                                 if w.samples and w.request.pipeline.matcher is not None
                                 and not w.request.pipeline.thinking])  # grammars hold after the thinking

    def _run(self, plan: StepPlan) -> Optional[StepResult]:
        """The forward pass; None when it failed (a failed pass cannot be pinned on one row:
        every row in it fails)."""
        try:
            return self.runner.run(plan.work, any(_scores(w) for w in plan.work))
        except Exception:
            log.exception("forward pass failed")
            return None

    def _failed(self, plan: StepPlan) -> list[RowOutcome]:
        return [RowOutcome(w.request, ends=True, outputs=[self._failure(w.request, "forward pass failed")])
                for w in plan.work]

    # ----- choose -----
    def _choose(self, plan: StepPlan, result: StepResult, masks: Optional[Future]) -> list[RowOutcome]:
        """Each row's tokens, chosen from its logits (masked by its grammar) and put through its
        output pipeline; a row that fails ends alone."""
        if masks is not None:
            self.masks.apply(masks.result(), result.logits)
        _force(plan, result.logits)
        step = StepLogits(result.logits, _logit_rows(plan))
        step.choose_greedy(plan.work)
        outcomes: list[RowOutcome] = []
        for i, w in enumerate(plan.work):
            try:
                outcomes += self._row(w, result, i, step)
            except Exception as exc:
                log.exception("request %s failed", w.request.request_id)
                outcomes.append(RowOutcome(w.request, w.count, ends=True, outputs=[self._failure(w.request, exc)]))
        return outcomes

    def _row(self, w: Work, result: StepResult, i: int, step: "StepLogits") -> list[RowOutcome]:
        """The row's outcome, and, when its answers fan out now, theirs (after it)."""
        if _scores(w):
            self._score_prompt(w, result, i)
        if not w.samples:
            return [RowOutcome(w.request, w.count)]
        children = w.request.parent.children if w.request.fans_out else []  # type: ignore[union-attr]
        prefilled = not w.request.generated and w.request.choice == 0
        outcomes = [RowOutcome(w.request, w.count, drafted=len(w.drafts), prefilled=prefilled)]
        outcomes += [RowOutcome(child, forked_from=w.request) for child in children]
        for outcome in outcomes:
            self._answer(w, outcome, step, i)
        return outcomes

    def _answer(self, w: Work, outcome: RowOutcome, step: "StepLogits", i: int) -> None:
        """An answer's tokens this step: chosen position after position while each is the draft
        that the next position assumed, each through the output pipeline until one ends it."""
        row = outcome.row
        if row.params.max_tokens == 0:  # a prompt's scores are the whole answer
            outcome.ends, outcome.outputs = True, [row_output(row, None, -1)]
            return
        try:
            for j in range(1 + len(w.drafts)):
                choice = step.choose(row, i, j, w.drafts[:j])
                if self._take(outcome, choice, step.rows(i, w)[j]) or j == len(w.drafts) \
                        or choice.token_id != w.drafts[j] or row.pipeline.forced is not None:
                    break  # (a forced token: the next step's first, whatever the drafts)
        except Exception as exc:
            log.exception("request %s failed", row.request_id)
            outcome.ends = True
            outcome.outputs.append(self._failure(row, exc))
        outcome.kept += len(outcome.tokens) - 1 if w.drafts else 0  # the drafts whose keys hold

    @staticmethod
    def _take(outcome: RowOutcome, choice: Choice, logits: torch.Tensor) -> bool:
        """The token through the row's output pipeline; whether it ends the answer."""
        row = outcome.row
        piece = row.pipeline.token(choice.token_id, logits, choice.logprob)
        outcome.outputs.append(row_output(row, piece, len(row.generated) + len(outcome.tokens)))
        outcome.tokens.append(choice.token_id)
        outcome.ends = piece.finish is not None
        return outcome.ends

    def _score_prompt(self, w: Work, result: StepResult, i: int) -> None:
        """Position j of the work predicts prompt token j + 1."""
        row = w.request
        following = row.prompt_ids[w.start + 1:min(w.start + w.count + 1, len(row.prompt_ids))]
        assert result.hidden is not None and row.prompt_scores is not None
        start = result.starts[i]
        score(self.loaded.model, result.hidden[start:start + len(following)], following, row.params.top_logprobs,
              self.token_texts, row.prompt_scores)

    def _failure(self, row: Request, error: BaseException | str) -> RequestOutput:
        return RequestOutput.failure(row.request_id, error, len(row.generated), len(row.prompt_ids),
                                     len(row.generated), row.seed, row.choice)

    # ----- emit -----
    def _emit(self, outcomes: list[RowOutcome]) -> None:
        """Metrics, then each reader's outputs, in order."""
        now = time.perf_counter()
        for o in outcomes:
            row = o.row
            if o.prefilled:
                self.observer.prefilled(len(row.prompt_ids), row.cached_tokens if self.kv.caching else None)
            if o.drafted:
                self._observe_drafts(o.drafted, max(0, len(o.tokens) - 1))
            for out in o.outputs:
                self._observe_output(row, out, now)
                row.sink(out)

    def _observe_drafts(self, drafted: int, accepted: int) -> None:
        self.speculation.spec_drafts += 1
        self.speculation.spec_draft_tokens += drafted
        self.speculation.spec_accepted_tokens += accepted
        self.observer.speculated(drafted, accepted)

    def _observe_output(self, row: Request, out: RequestOutput, now: float) -> None:
        if out.token_ids:
            first = out.index == 0
            self.observer.token(first, now - (row.arrival if first else row.last_token_at))
            row.last_token_at = now
        if out.ends:
            self.observer.finished(out.finish_reason, now - row.arrival)

    # ----- failure of the loop itself -----
    def fail_all(self, message: str, close: bool = False) -> None:
        """Fail every request in flight and start again from an empty pool (close: for good)."""
        for row in self.scheduler.fail_all(close):
            self.observer.finished(FinishReason.ERROR, time.perf_counter() - row.arrival)
            row.sink(self._failure(row, message))

    def close(self) -> None:
        self.masks.shutdown()


@dataclass
class StepLogits:
    """A step's logits: each sampling work's rows (its last token's, then its drafts'), and the
    plain greedy rows' choices, made for all of them at once."""

    logits: torch.Tensor
    firsts: list[int]
    greedy: dict[int, Choice] = field(default_factory=dict)  # by logits row

    def rows(self, i: int, w: Work) -> torch.Tensor:
        return self.logits[self.firsts[i]:self.firsts[i] + 1 + len(w.drafts)]

    def choose(self, row: Request, i: int, j: int, drafts: list[int]) -> Choice:
        """The row's token at logits row j of work i (after these drafts): the plain greedy rows'
        from the batch's argmax, the others' from their own chooser."""
        at = self.firsts[i] + j
        choice = self.greedy.get(at) if row.chooser.plain_greedy else None
        return choice or row.chooser.choose(row.history() + drafts, self.logits[at:at + 1], len(row.generated) + j)

    def choose_greedy(self, work: list[Work]) -> None:
        """Every plain greedy row's positions at once (greedy.c: one call for the batch)."""
        index = [self.firsts[i] + j for i, w in enumerate(work) if w.samples and w.request.chooser.plain_greedy
                 for j in range(1 + len(w.drafts))]
        if index:
            rows = self.logits[index] if len(index) < self.logits.shape[0] else self.logits
            self.greedy = dict(zip(index, greedy_choices(rows), strict=True))


def _force(plan: StepPlan, logits: torch.Tensor) -> None:
    """A row whose next token is forced (a spent reasoning budget's close marker) can choose only
    it, greedy or sampled; its log probability is then 0, as it was chosen from."""
    for w, first in zip(plan.work, _logit_rows(plan), strict=True):
        token = w.request.pipeline.forced if w.samples else None
        if token is not None:
            with torch.inference_mode():  # the logits are the forward pass's inference tensor
                kept = logits[first, token].clone()
                logits[first].fill_(float("-inf"))
                logits[first, token] = kept


def _logit_rows(plan: StepPlan) -> list[int]:
    """Where each work's logits begin in the step's (a sampling row's last token's, then its drafts')."""
    sizes = [(1 + len(w.drafts)) if w.samples else 0 for w in plan.work]
    return list(itertools.accumulate(sizes, initial=0))[:-1]


def _scores(w: Work) -> bool:
    """The row scores its prompt and this work holds prompt positions still to score."""
    scores = w.request.prompt_scores
    return scores is not None and not scores.complete and w.start < len(w.request.prompt_ids) - 1
