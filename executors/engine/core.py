"""One engine step: prefill newcomers (chunked), then one batched decode for all.

Synchronous and single-threaded by design: the engine process (core_process.py) runs it,
or AsyncEngine on a thread of its own. Errors inside one request end that request only.
"""
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Optional, TypeVar

import torch
from transformers import DynamicCache

from contract import SEED_MAX, EngineConfig, FinishReason, SamplingParams

from .detokenizer import IncrementalDetokenizer, byte_fallback_ids
from .kv_batch import KVBatch, new_cache, prefill_chunk, prefill_group, select_rows
from .loader import LoadedModel
from .logprobs import TokenTexts, raw_logprob
from .observer import EngineObserver
from .outputs import RequestOutput
from .prefix_cache import PrefixCache
from .prefix_reuse import PrefixReuse
from .prepare import Prepared
from .prompt_logprobs import PromptScores, final_hidden_states, score
from .request import Request, RequestState
from .sampling import Choice, TokenChooser, greedy_choices
from .scheduler import Scheduler, plan_prefill
from .stopping import StopSequenceFilter, stop_reason
from .structured import GrammarCompiler, MaskFiller, constrained, grammar_complete
from .tools import ToolCallDelta, tool_parser

log = logging.getLogger(__name__)
T = TypeVar("T")


class EngineCore:
    def __init__(self, loaded: LoadedModel, config: EngineConfig):
        self.loaded = loaded
        self.config = config
        self.tokenizer = loaded.tokenizer
        self.scheduler = Scheduler(config)
        self.batch = KVBatch(loaded.model, loaded.device)
        self.special_ids = frozenset(self.tokenizer.all_special_ids)
        self.byte_ids = byte_fallback_ids(self.tokenizer)
        self.grammars = GrammarCompiler(self.tokenizer, config.limits)
        self.token_texts = TokenTexts(self.tokenizer)
        self.masks = MaskFiller(self.grammars.tokenizer.vocab_size if self.grammars.tokenizer else 0)
        self.prefix = PrefixReuse(PrefixCache(config.prefix_cache_tokens) if config.prefix_caching else None)
        self._aborts: set[str] = set()
        self._abort_lock = threading.Lock()
        self.steps = 0
        self.aborted = 0  # requests that left early because their reader went away
        self.loop_restarts = 0  # steps that failed as a whole (see safe_step)
        self.observer = EngineObserver()  # metrics: the executor sets its own

    # ----- requests in -----
    def add(self, request_id: str, prepared: Prepared, sink: Callable[[RequestOutput], None]) -> Request:
        """Queue a prepared request (see prepare.py); raises when it cannot be served:
        overloaded, or beyond the batch budget."""
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
        return Request(request_id, ids, params, seed, TokenChooser(params, seed, self.loaded.device, len(ids)),
                       IncrementalDetokenizer(self.tokenizer, self.byte_ids), StopSequenceFilter(params.stop),
                       sink, matcher=matcher or self.grammars.matcher(params), tool_parser=tool_parser(params),
                       choice=choice)

    def _answers(self, req: Request) -> list[Request]:
        """The other n - 1 answers of a request whose prompt was just prefilled: answer i is
        seeded with seed + i, so the answers differ from each other and each is reproducible."""
        answers = [self._request(req.request_id, req.prompt_ids, req.params,
                                 None if req.seed is None else (req.seed + i) % (SEED_MAX + 1), req.sink, choice=i)
                   for i in range(1, req.rows)]
        for answer in answers:
            answer.prompt_scores, answer.cached_tokens = req.prompt_scores, req.cached_tokens
        return answers

    def abort(self, request_id: str) -> None:
        """Thread-safe; the request leaves before the next forward pass."""
        with self._abort_lock:
            self._aborts.add(request_id)

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work or bool(self._aborts)

    def stats(self) -> dict:
        sched = self.scheduler
        return {"running": len(sched.running), "prefilling": len(sched.prefilling),
                "waiting": sched.num_waiting, "reserved_tokens": sched.reserved,
                "batch_rows": len(self.batch), "steps": self.steps, "aborted": self.aborted,
                "loop_restarts": self.loop_restarts, **self.prefix.stats()}

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
        now = time.perf_counter()
        for req in self.scheduler.admit():
            self.observer.admitted(now - req.arrival)
        if len(self.batch):
            self._decode()
        self._prefill_some()

    def _apply_aborts(self) -> None:
        with self._abort_lock:
            aborts, self._aborts = self._aborts, set()
        if not aborts:
            return
        gone = [req for rid in aborts if (req := self.scheduler.remove_waiting(rid)) is not None]
        for req in list(self.scheduler.prefilling) + list(self.scheduler.running.values()):
            if req.request_id in aborts:  # every answer of the request
                self.scheduler.release(req)
                gone.append(req)
        for req in gone:
            self.aborted += 1
            self.observer.finished(FinishReason.ABORTED, time.perf_counter() - req.arrival)
        self._drop_finished_rows()

    def _decode(self) -> None:
        rows = [self.scheduler.running[r] for r in self.batch.rows]
        masks = self.masks.start(constrained(rows))  # filled while the forward pass runs
        try:
            logits = self.batch.decode_step()
        except Exception as exc:  # a failed forward cannot be pinned on one row
            log.exception("decode step failed")
            self._fail_batch(f"decode step failed: {exc}")
            return
        if masks is not None:
            self.masks.apply(masks.result(), logits)
        choices = self._choose(rows, logits)
        next_tokens = []
        for row, (req, choice) in enumerate(zip(rows, choices, strict=True)):
            if choice is not None and self._advance(req, choice):
                next_tokens.append(choice.token_id)
            elif choice is not None and self.batch.cache is not None:  # finished: its answer's KV too
                held = int(self.batch.mask[row].sum())  # the history but its last token
                if held == len(req.history()) - 1:
                    self.prefix.remember(req.history(), held, self.batch.cache, row, self.batch.mask.shape[1] - held)
        self._drop_finished_rows()
        if len(self.batch):
            self.batch.set_next_tokens(next_tokens)

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

    def _prefill_some(self) -> None:
        """Whole short prompts go in padded groups of similar length; a prompt longer than
        the budget is prefilled a chunk per step, so running streams keep their pace. Its
        chunks are always `budget` long, whatever else runs: on the fallbacks, chunk
        boundaries change a prompt's rounding, and a request must come out as it does alone."""
        budget = self.config.max_prefill_tokens
        ready = self.prefix.ready(self.scheduler.prefilling)
        groups = plan_prefill(ready, budget)
        for group in groups:
            self._prefill_group(group)
        planned = {r.request_id for g in groups for r in g}
        rest = [r for r in ready if r.request_id not in planned and r.state == RequestState.PREFILLING]
        left = budget - sum(max(len(r.prompt_ids) for r in g) * len(g) for g in groups)
        for i, req in enumerate(rest):  # the oldest long prompt advances every step: none starves it
            size = min(budget, len(req.prompt_ids) - req.prefilled)
            if i and size > left:  # the others (a prompt after its cached prefix, say) while room is left
                break
            left -= size
            self._or_fail_request(req, self._prefill_chunk, req, budget)

    def _prefill_group(self, group: list[Request]) -> None:
        cache = new_cache()
        model = self.loaded.model
        try:
            with final_hidden_states(model, any(r.prompt_scores for r in group)) as hidden:
                logits, mask = prefill_group(model, cache, [r.prompt_ids for r in group], self.loaded.device)
            for row, req in enumerate(group):
                if req.prompt_scores is not None:  # row `row` is left-padded to the group's width
                    width, length = mask.shape[1], len(req.prompt_ids)
                    score(model, hidden[0][row, width - length:width - 1], req.prompt_ids[1:],
                          req.params.top_logprobs, self.token_texts, req.prompt_scores)
        except Exception as exc:
            log.exception("prefill failed")
            for req in group:
                self._finish_with_error(req, f"prefill failed: {exc}")
            return
        self._start_running(group, logits, cache, mask)

    def _prefill_chunk(self, req: Request, budget: int) -> None:
        if req.cache is None:
            req.cache = new_cache()
        start, model = req.prefilled, self.loaded.model
        chunk = req.prompt_ids[start:start + budget]
        with final_hidden_states(model, req.prompt_scores is not None) as hidden:
            logits = prefill_chunk(model, req.cache, chunk, start, self.loaded.device)
        if req.prompt_scores is not None:  # position j predicts prompt token j + 1
            following = req.prompt_ids[start + 1:start + len(chunk) + 1]
            score(model, hidden[0][0, :len(following)], following, req.params.top_logprobs, self.token_texts,
                  req.prompt_scores)
        req.prefilled += len(chunk)
        if req.prefilled == len(req.prompt_ids):  # joins the batch at once: its first token goes out now
            mask = torch.ones((1, len(req.prompt_ids)), dtype=torch.long)
            cache, req.cache = req.cache, None
            self._start_running([req], logits, cache, mask)

    def _start_running(self, prefilled: list[Request], logits: torch.Tensor, cache: DynamicCache,
                       mask: torch.Tensor) -> None:
        """First tokens out, then the rows that go on join the decode batch. logits:
        [len(prefilled), vocab] float32, each prompt's last position; cache: len(prefilled)
        rows of [heads, width, head_dim] per layer, left-padded; mask: [len(prefilled), width],
        1 where a row has a token. A request with n answers becomes n rows here, each a copy
        of its prompt's row."""
        group: list[Request] = []
        source: list[int] = []  # the prefilled row that each of group's rows copies
        for row, req in enumerate(prefilled):
            length = len(req.prompt_ids)
            self.prefix.remember(req.prompt_ids, length, cache, row, mask.shape[1] - length)
            answers = self._answers(req)
            self.scheduler.start_running(req, answers)
            self.observer.prefilled(length, req.cached_tokens if self.prefix.on else None)
            group += [req, *answers]
            source += [row] * (1 + len(answers))
        if len(group) > len(prefilled):
            logits = logits[source]
        rows = constrained(group)
        if rows:
            self.masks.apply(self.masks.fill(rows), logits)
        choices = self._choose(group, logits)
        going_on = [i for i, (req, c) in enumerate(zip(group, choices, strict=True))
                    if c is not None and self._first(req, c)]
        if not going_on:
            return
        joining = [group[i] for i in going_on]
        tokens = [c.token_id for c in (choices[i] for i in going_on) if c is not None]
        try:
            kept = [source[i] for i in going_on]
            if kept != list(range(len(prefilled))):
                select_rows(cache, kept)
                mask = mask[kept]
            self.batch.add([r.row_id for r in joining], cache, mask, tokens)
        except Exception as exc:  # e.g. out of memory while merging: these rows only
            log.exception("could not add rows to the batch")
            for req in joining:
                self._finish_with_error(req, f"could not join the batch: {exc}")
            if not self.batch.consistent():  # half-merged: the batch itself is lost
                self._fail_batch(f"batch merge failed: {exc}")
            else:
                self._drop_finished_rows()

    def _first(self, req: Request, choice: Choice) -> bool:
        """The first token out (or, for max_tokens 0, the prompt's scores alone); whether the
        answer goes on."""
        if req.params.max_tokens > 0:
            return self._advance(req, choice)
        self.scheduler.release(req)
        self.observer.finished(FinishReason.LENGTH, time.perf_counter() - req.arrival)
        req.sink(RequestOutput(req.request_id, finish_reason=FinishReason.LENGTH, prompt_tokens=len(req.prompt_ids),
                               seed=req.seed, choice=req.choice, prompt=req.prompt_scores,
                               cached_tokens=req.cached_tokens))
        return False

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

    def _fail_batch(self, message: str) -> None:
        for row in list(self.batch.rows):
            if row in self.scheduler.running:
                self._finish_with_error(self.scheduler.running[row], message)
        self.batch = KVBatch(self.loaded.model, self.loaded.device)

    def _drop_finished_rows(self) -> None:
        """Drop rows whose request is no longer running."""
        live = [r for r in self.batch.rows if r in self.scheduler.running]
        self.batch.keep(live)

    # ----- failure of the loop itself -----
    def fail_all(self, message: str, close: bool = False) -> None:
        """Fail every request in flight and start from an empty batch (close: for good)."""
        waiting = self.scheduler.drain_waiting(close)
        for req in waiting + list(self.scheduler.prefilling) + list(self.scheduler.running.values()):
            self._finish_with_error(req, message)
        self.batch = KVBatch(self.loaded.model, self.loaded.device)

    def close(self) -> None:
        self.masks.shutdown()

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running) + len(self.scheduler.prefilling)
