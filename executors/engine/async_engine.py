"""The decode loop on its own thread, and per-request async streams.

The model never runs on the event loop. Each request gets a RequestStream: the
loop pushes tokens into it without ever blocking, and a slow reader receives
everything pending as one coalesced chunk, so memory stays bounded by max_tokens
and a slow client never slows the batch.
"""
import asyncio
import logging
import threading
import time
import weakref
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Optional

from .core import EngineCore
from .errors import GenerationError
from .loader import LoadedModel, load_model
from .observer import EngineObserver
from .params import EngineConfig, EngineDeadError, FinishReason, SamplingParams
from .request import Request, TokenOutput

log = logging.getLogger(__name__)


@dataclass
class StreamChunk:
    """Everything a reader had not yet taken: usually one token, several if it fell behind."""

    token_ids: list[int]
    logprobs: list[float]
    special: list[bool]
    text: str
    generated_text: str  # all text so far
    index: int  # position of the last token in the generation
    finish_reason: Optional[FinishReason] = None
    prompt_tokens: int = 0
    generated_tokens: int = 0
    seed: Optional[int] = None


@dataclass
class RequestStream:
    request_id: str
    loop: asyncio.AbstractEventLoop
    _pending: list[TokenOutput] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    _text: str = ""
    done: bool = False
    interval: int = 1  # tokens per chunk at least (the last may carry fewer): stream_interval

    def push(self, out: TokenOutput) -> None:
        """Engine thread: never blocks, wakes the reader once `interval` tokens are pending
        (or the request ended), at most once per batch of them."""
        with self._lock:
            self._pending.append(out)
            ended = out.finish_reason is not None or out.error is not None
            wake = len(self._pending) == self.interval or (ended and len(self._pending) < self.interval)
        if wake:
            try:
                self.loop.call_soon_threadsafe(self._wakeup.set)
            except RuntimeError:  # the event loop is closed: nobody is reading
                pass

    async def next_chunk(self) -> StreamChunk:
        await self._wakeup.wait()
        with self._lock:
            items, self._pending = self._pending, []
            self._wakeup.clear()
        tokens = [o for o in items if o.error is None]
        errors = [o for o in items if o.error is not None]
        if errors and not tokens:
            self.done = True
            raise GenerationError(errors[0].error)
        if errors:  # deliver the tokens first, the error on the next read
            with self._lock:
                self._pending = errors + self._pending
                self._wakeup.set()
        return self._merge(tokens)

    def _merge(self, tokens: list[TokenOutput]) -> StreamChunk:
        last = tokens[-1]
        text = "".join(o.text for o in tokens)
        self._text += text
        self.done = last.finish_reason is not None
        return StreamChunk([o.token_id for o in tokens], [o.logprob for o in tokens],
                           [o.special for o in tokens], text, self._text, last.index,
                           last.finish_reason, last.prompt_tokens, last.generated_tokens, last.seed)


class AsyncEngine:
    """Owns the model and the loop thread; `generate` is the one entry point."""

    def __init__(self, config: EngineConfig, loaded: Optional[LoadedModel] = None,
                 observer: Optional[EngineObserver] = None):
        self.config = config.validate()
        self.core = EngineCore(loaded or load_model(config), config)
        if observer is not None:
            self.core.observer = observer
        self._wake = threading.Condition()
        self._stopping = False
        self.loop_restarts = 0
        self.last_error: Optional[str] = None
        # one thread renders and tokenizes requests: off the event loop, and the tokenizer is
        # then used by at most two threads (this one and the decode loop's detokenizer)
        self._prepare = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llm-prepare")
        self._thread = threading.Thread(target=self._run, name="llm-decode-loop", daemon=True)
        self._thread.start()

    @property
    def tokenizer(self):
        return self.core.tokenizer

    @property
    def healthy(self) -> bool:
        return self._thread.is_alive() and not self._stopping

    def stats(self) -> dict:
        sched = self.core.scheduler
        return {"running": len(sched.running), "prefilling": len(sched.prefilling),
                "waiting": sched.num_waiting, "reserved_tokens": sched.reserved,
                "batch_rows": len(self.core.batch), "steps": self.core.steps,
                "aborted": self.core.aborted,
                "loop_restarts": self.loop_restarts, "healthy": self.healthy}

    def generate(self, prompt: str, params: SamplingParams,
                 request_id: Optional[str] = None) -> AsyncIterator[StreamChunk]:
        """Validation and overload errors raise before the first chunk; the request
        is aborted as soon as the caller stops iterating (disconnect, cancel, error).
        Tokenizes on the calling thread: the service uses `open`."""
        stream = self._new_stream(request_id, params)
        return self._start(stream, self.core.make_request(prompt, params, stream.push, request_id))

    async def open(self, prompt: str, params: SamplingParams, messages: Any = None,
                   request_id: Optional[str] = None) -> AsyncIterator[StreamChunk]:
        """The service's entry point, for a prompt or chat messages: validation, chat rendering
        and tokenization run on the engine's preparation thread, never on the event loop.
        Errors raise here, before the first chunk."""
        stream = self._new_stream(request_id, params)
        request = await asyncio.get_running_loop().run_in_executor(
            self._prepare, self.core.make_request, prompt, params, stream.push, request_id, messages)
        return self._start(stream, request)

    def _new_stream(self, request_id: Optional[str], params: SamplingParams) -> RequestStream:
        if not self.healthy:
            raise EngineDeadError("the decode loop is not running")
        interval = params.stream_interval if isinstance(params.stream_interval, int) else self.config.stream_interval
        return RequestStream(request_id or "", asyncio.get_running_loop(), interval=max(1, interval))

    def _start(self, stream: RequestStream, request: Request) -> AsyncIterator[StreamChunk]:
        stream.request_id = request.request_id
        self.core.submit(request)
        with self._wake:
            self._wake.notify()
        iterator = self._iterate(stream)
        # a stream dropped before its first read never runs its `finally`: abort it then too
        weakref.finalize(iterator, self._abort_unfinished, stream)
        return iterator

    async def _iterate(self, stream: RequestStream) -> AsyncIterator[StreamChunk]:
        try:
            while not stream.done:
                yield await stream.next_chunk()
        finally:
            self._abort_unfinished(stream)

    def _abort_unfinished(self, stream: RequestStream) -> None:
        if not stream.done:
            stream.done = True
            self.abort(stream.request_id)

    def abort(self, request_id: str) -> None:
        self.core.abort(request_id)
        with self._wake:
            self._wake.notify()

    def _run(self) -> None:
        while not self._stopping:
            with self._wake:
                while not self._stopping and not self.core.has_work:
                    self._wake.wait(timeout=1.0)
            if self._stopping:
                break
            try:
                self.core.step()
            except Exception as exc:  # the loop survives: fail what is in flight, start clean
                log.exception("engine step failed; failing in-flight requests and restarting the loop")
                self.loop_restarts += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
                self.core.fail_all(f"engine error: {self.last_error}")
                time.sleep(0.01)
        self.core.fail_all("the engine is shutting down", close=True)

    def shutdown(self, timeout: float = 10.0) -> None:
        self._stopping = True
        with self._wake:
            self._wake.notify_all()
        self._thread.join(timeout)
        self._prepare.shutdown(wait=False, cancel_futures=True)
