"""One engine step: the scheduler's work for every row in one forward pass, then each row
that reached the end of its history chooses its next token.

Synchronous and single-threaded by design: the engine process (core_process.py) runs it,
or AsyncEngine on a thread of its own. Errors inside one request end that request only.
"""
import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any, Optional, TypeVar

import torch

from contract import SEED_MAX, EngineConfig, FinishReason, SamplingParams

from ..client.prepare import Prepared
from ..model.loader import LoadedModel
from ..model.model_runner import ModelRunner, StepResult
from ..observer import EngineObserver
from ..outputs import RequestOutput
from ..policies.detokenizer import IncrementalDetokenizer, byte_fallback_ids
from ..policies.logprobs import TokenTexts, raw_logprob
from ..policies.prompt_logprobs import PromptScores, score
from ..policies.sampling import Choice, TokenChooser, greedy_choices
from ..policies.speculation import PromptLookup, SpeculationCounts
from ..policies.stopping import StopSequenceFilter, stop_reason
from ..policies.structured import GrammarCompiler, MaskFiller, grammar_complete
from ..policies.tools import ToolCallDelta, tool_parser
from .kv_manager import KVCacheManager
from .kv_pool import KVPool, KVShape
from .request import Request, RequestState
from .scheduler import Scheduler, Work

log = logging.getLogger(__name__)
T = TypeVar("T")


class EngineCore:
    def __init__(self, loaded: LoadedModel, config: EngineConfig):
        self.loaded = loaded
        self.config = config
        self.tokenizer = loaded.tokenizer
        shape = KVShape.of(loaded.model.config, loaded.model.dtype)
        pool = KVPool(shape, shape.blocks_for(config.max_batch_tokens, config.kv_cache_bytes), loaded.device)
        self.kv = KVCacheManager(pool, config.prefix_caching)
        self.scheduler = Scheduler(config, self.kv, lambda: self.observer.preempted())
        self.runner = ModelRunner(loaded, self.kv)
        self.runner.probe()
        self.special_ids = frozenset(self.tokenizer.all_special_ids)
        self.byte_ids = byte_fallback_ids(self.tokenizer)
        self.grammars = GrammarCompiler(self.tokenizer, config.limits)
        self.token_texts = TokenTexts(self.tokenizer)
        self.masks = MaskFiller(self.grammars.tokenizer.vocab_size if self.grammars.tokenizer else 0)
        self._aborts: set[str] = set()
        self._abort_lock = threading.Lock()
        self.steps = 0
        self.aborted = 0  # requests that left early because their reader went away
        self.loop_restarts = 0  # steps that failed as a whole (see safe_step)
        self.speculation = SpeculationCounts()
        self.observer = EngineObserver()  # metrics: the executor sets its own

    # ----- requests in -----
    def add(self, request_id: str, prepared: Prepared, sink: Callable[[RequestOutput], None]) -> Request:
        """Queue a prepared request (see prepare.py); raises when it cannot be served:
        overloaded, or beyond the KV cache."""
        request = self._request(request_id, prepared.prompt_ids, prepared.params, prepared.seed, sink,
                                prepared.matcher)
        request.rows = prepared.params.n
        if prepared.params.prompt_logprobs:
            request.prompt_scores = PromptScores(list(request.prompt_ids),
                                                 [self.token_texts(t) for t in request.prompt_ids])
        self.scheduler.submit(request)
        return request

    def _request(self, request_id: str, ids: list[int], params: SamplingParams, seed: Optional[int],
                 sink: Callable[[RequestOutput], None], matcher: Any = None, choice: int = 0) -> Request:
        """One answer's state: its own chooser (seeded), detokenizer, stop filter, grammar."""
        matcher = matcher or self.grammars.matcher(params)
        speculative = 0 if matcher is not None else (  # a grammar's masks are made one position at a time
            self.config.speculative_tokens if params.speculative_tokens is None else params.speculative_tokens)
        drafter = PromptLookup(self.config.speculative_ngram_min, self.config.speculative_ngram_max) \
            if speculative else None
        return Request(request_id, ids, params, seed, TokenChooser(params, seed, self.loaded.device, len(ids)),
                       IncrementalDetokenizer(self.tokenizer, self.byte_ids), StopSequenceFilter(params.stop),
                       sink, matcher=matcher, tool_parser=tool_parser(params), choice=choice, drafter=drafter,
                       speculative=speculative)

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
        now = time.perf_counter()
        for req in plan.admitted:
            self.observer.admitted(now - req.arrival)
        if plan.work:
            self._run(plan.work)

    def _apply_aborts(self) -> None:
        with self._abort_lock:
            aborts, self._aborts = self._aborts, set()
        if not aborts:
            return
        gone = [req for rid in aborts for req in self.scheduler.remove_waiting(rid)]
        for req in list(self.scheduler.running):
            if req.request_id in aborts:  # every answer of the request
                self.scheduler.release(req)
                gone.append(req)
        for req in gone:
            self.aborted += 1
            self.observer.finished(FinishReason.ABORTED, time.perf_counter() - req.arrival)

    def _run(self, work: list[Work]) -> None:
        sampling = [w for w in work if w.samples]
        first = list(itertools.accumulate((1 + len(w.drafts) for w in sampling), initial=0))  # each one's logits
        masks = self.masks.start([(first[i], w.request.matcher) for i, w in enumerate(sampling)
                                  if w.request.matcher is not None])  # filled while the forward pass runs
        try:
            result = self.runner.run(work, any(self._scores(w) for w in work))
        except Exception as exc:  # a failed forward cannot be pinned on one row
            log.exception("forward pass failed")
            for w in work:
                self._finish_with_error(w.request, f"forward pass failed: {exc}")
            return
        for i, w in enumerate(work):
            self._computed(w)
            if self._scores(w):
                self._or_fail_request(w.request, self._score_prompt, w, result, i)
        logits = result.logits
        if masks is not None:
            self.masks.apply(masks.result(), logits)
        plain = [i for i, w in enumerate(sampling) if not w.drafts and w.request.state is RequestState.RUNNING]
        choosing, chosen = self._fork_answers([sampling[i].request for i in plain], logits[[first[i] for i in plain]])
        for req, choice in zip(choosing, self._choose(choosing, chosen), strict=True):
            if choice is None:
                continue
            if req.params.max_tokens > 0:
                self._advance(req, choice)
            else:
                self._scored_only(req)
        for i, w in enumerate(sampling):
            if w.drafts and w.request.state is RequestState.RUNNING:  # not preempted by a fork
                self._verify(w, logits[first[i]:first[i + 1]])

    def _verify(self, w: Work, logits: torch.Tensor) -> None:
        """A speculating row's next tokens, chosen position after position as plain decode steps
        would choose them, while each is the draft that the next position assumed (speculation.py)."""
        req, before, accepted = w.request, w.request.computed, 0
        for i in range(len(w.drafts) + 1):
            choice = self._choose([req], logits[i:i + 1])[0]
            if choice is None or not self._advance(req, choice) or i == len(w.drafts) or choice.token_id != w.drafts[i]:
                break
            accepted += 1
            req.computed += 1  # the draft's keys and values hold: it is the token chosen
        if accepted and req.state is RequestState.RUNNING:
            self.kv.computed(req, before)
        self.speculation.spec_drafts += 1
        self.speculation.spec_draft_tokens += len(w.drafts)
        self.speculation.spec_accepted_tokens += accepted
        self.observer.speculated(len(w.drafts), accepted)

    def _computed(self, w: Work) -> None:
        req = w.request
        req.computed += w.count
        self.kv.computed(req, w.start)
        if w.samples and not req.generated and req.choice == 0:  # its prompt, the first time
            self.observer.prefilled(len(req.prompt_ids), req.cached_tokens if self.kv.caching else None)

    @staticmethod
    def _scores(w: Work) -> bool:
        """The row scores its prompt and this work holds prompt positions still to score."""
        scores = w.request.prompt_scores
        return scores is not None and not scores.complete and w.start < len(w.request.prompt_ids) - 1

    def _score_prompt(self, w: Work, result: StepResult, i: int) -> None:
        """Position j of the work predicts prompt token j + 1."""
        req = w.request
        following = req.prompt_ids[w.start + 1:min(w.start + w.count + 1, len(req.prompt_ids))]
        assert result.hidden is not None and req.prompt_scores is not None
        start = result.starts[i]
        score(self.loaded.model, result.hidden[start:start + len(following)], following, req.params.top_logprobs,
              self.token_texts, req.prompt_scores)

    def _fork_answers(self, choosing: list[Request], logits: torch.Tensor) -> tuple[list[Request], torch.Tensor]:
        """A request with n answers whose prompt was just computed becomes n rows: answer i is
        seeded with seed + i, shares the prompt's blocks, and chooses from the same logits."""
        if all(r.rows == 1 for r in choosing):
            return choosing, logits
        rows, source = [], []
        for i, req in enumerate(choosing):
            answers = self._answers(req) if req.rows > 1 else []
            rows += [req, *answers]
            source += [i] * (1 + len(answers))
        return rows, logits[source]

    def _answers(self, req: Request) -> list[Request]:
        answers = []
        for i in range(1, req.rows):
            seed = None if req.seed is None else (req.seed + i) % (SEED_MAX + 1)
            answer = self._request(req.request_id, req.prompt_ids, req.params, seed, req.sink, choice=i)
            answer.prompt_scores, answer.cached_tokens = req.prompt_scores, req.cached_tokens
            while not self.kv.fork(req, answer):  # room for its last block: the latest other rows wait
                self.scheduler.preempt_latest(but=req)
            self.scheduler.add_running(answer)
            answers.append(answer)
        req.rows = 1
        return answers

    def _choose(self, rows: list[Request], logits: torch.Tensor) -> list[Choice | None]:
        """logits: [len(rows), vocab] float32, row i for rows[i]'s next token. Plain greedy
        rows share one argmax; the others choose alone (None: that request failed)."""
        choices: list[Choice | None] = [None] * len(rows)
        plain = {i for i, r in enumerate(rows) if r.chooser.plain_greedy}
        if plain:
            index = sorted(plain)
            for i, c in zip(index, greedy_choices(logits[index] if len(index) < len(rows) else logits), strict=True):
                choices[i] = c
        for i, req in enumerate(rows):
            if choices[i] is None:
                choices[i] = self._or_fail_request(req, req.chooser.choose, req.history(), logits[i:i + 1])
            choice = choices[i]
            if choice is not None and (i not in plain or req.params.top_logprobs):  # the model's own, per row
                choice.logprob, choice.alternatives = raw_logprob(logits[i], choice.token_id, req.params.top_logprobs,
                                                                  self.token_texts)
        return choices

    def _or_fail_request(self, req: Request, fn: Callable[..., T], *args: Any) -> Optional[T]:
        """fn(*args), or None when it failed: that fails this request only."""
        try:
            return fn(*args)
        except Exception as exc:
            log.exception("request %s failed", req.request_id)
            self._finish_with_error(req, f"{type(exc).__name__}: {exc}")
            return None

    def _scored_only(self, req: Request) -> None:
        """max_tokens 0: the prompt's scores are the answer."""
        self.scheduler.release(req)
        self.observer.finished(FinishReason.LENGTH, time.perf_counter() - req.arrival)
        req.sink(RequestOutput(req.request_id, finish_reason=FinishReason.LENGTH, prompt_tokens=len(req.prompt_ids),
                               seed=req.seed, choice=req.choice, prompt=req.prompt_scores,
                               cached_tokens=req.cached_tokens))

    def _advance(self, req: Request, choice: Choice) -> bool:
        """Record a token and emit it; return whether the request goes on."""
        try:
            out = self._token_output(req, choice)
        except Exception as exc:
            log.exception("request %s failed", req.request_id)
            self._finish_with_error(req, f"{type(exc).__name__}: {exc}")
            return False
        self._observe_token(req, out.finish_reason)
        if out.finish_reason is not None:
            self.scheduler.release(req)
        req.sink(out)
        return out.finish_reason is None

    def _observe_token(self, req: Request, finish: Optional[FinishReason]) -> None:
        now = time.perf_counter()
        first = len(req.generated) == 1
        self.observer.token(first, now - (req.arrival if first else req.last_token_at))
        req.last_token_at = now
        if finish is not None:
            self.observer.finished(finish, now - req.arrival)

    def _token_output(self, req: Request, choice: Choice) -> RequestOutput:
        token = choice.token_id
        req.generated.append(token)
        delta = req.detokenizer.add(token)
        finish = stop_reason(token, len(req.generated), req.params, self.loaded.eos_token_ids)
        if req.matcher is not None and grammar_complete(req.matcher, token):
            finish = finish or FinishReason.EOS
        if finish is not None:
            delta += req.detokenizer.flush()
        text, hit_stop = req.stops.add(delta)
        if hit_stop:
            finish = FinishReason.STOP
        elif finish is not None:
            text += req.stops.flush()
        calls: list[ToolCallDelta] = []
        if req.tool_parser is not None:
            text, calls = req.tool_parser.feed(text)
            if finish is not None:
                text += req.tool_parser.finish()
                if finish == FinishReason.EOS and req.tool_parser.called:
                    finish = FinishReason.TOOL_CALLS
        asked = req.params.logprobs or req.params.top_logprobs > 0
        return RequestOutput(req.request_id, [token], [text], [choice.logprob], [token in self.special_ids],
                             len(req.generated) - 1, finish, prompt_tokens=len(req.prompt_ids),
                             generated_tokens=len(req.generated), seed=req.seed, tool_calls=calls,
                             alternatives=[choice.alternatives] if asked else [],
                             token_strs=[self.token_texts(token)] if asked else [], choice=req.choice,
                             prompt=req.prompt_scores if len(req.generated) == 1 else None,
                             cached_tokens=req.cached_tokens)

    def _finish_with_error(self, req: Request, message: str) -> None:
        self.scheduler.release(req)
        self.observer.finished(FinishReason.ERROR, time.perf_counter() - req.arrival)
        req.emit_error(message)

    # ----- failure of the loop itself -----
    def fail_all(self, message: str, close: bool = False) -> None:
        """Fail every request in flight and start again from an empty pool (close: for good)."""
        waiting = self.scheduler.drain_waiting(close)
        for req in waiting + list(self.scheduler.running):
            self._finish_with_error(req, message)
        self.kv.reset()

    def close(self) -> None:
        self.masks.shutdown()
