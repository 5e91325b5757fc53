"""The engine as the service sees it: `open` a request, read its chunks, `abort` it.

EngineClient is what the executor uses, wherever the decode loop runs: AsyncEngine
(in_process.py) runs it on a thread of this process; EngineProcess (engine_process.py) in a process of its own.
Either way the model never runs on the event loop, requests are prepared (validated,
rendered, tokenized) on one preparation thread, and a request is aborted as soon as its
reader goes away.
"""
import asyncio
import uuid
import weakref
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator
from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing
from typing import Any, Optional, Union

from contract import EngineConfig, EngineDeadError, SamplingParams, check

from ..messages import Prepared
from ..model.info import ModelInfo
from ..observer import EngineObserver
from ..outputs import RequestOutput, by_choice
from .prepare import Preparer
from .streams import RequestStream


class EngineClient(ABC):
    config: EngineConfig
    preparer: Preparer
    info: ModelInfo
    observer: EngineObserver

    def __init__(self, config: EngineConfig):
        self.config = config.validate()
        self.start_stages: dict[str, float] = {}  # what its start cost, stage by stage (seconds; engine_process.py)
        # one thread renders and tokenizes requests: off the event loop, and the tokenizer is
        # then used by at most two threads (this one and the decode loop's detokenizer)
        self._prepare = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llm-prepare")

    @property
    def tokenizer(self):
        return self.preparer.tokenizer

    @property
    @abstractmethod
    def healthy(self) -> bool: ...

    @abstractmethod
    def stats(self) -> dict:
        """Batch occupancy and counters (see EngineCore.stats), plus `healthy`."""

    @abstractmethod
    def abort(self, request_id: str) -> None:
        """The request leaves before the next forward pass; unknown ids are ignored."""

    @abstractmethod
    async def _submit(self, stream: RequestStream, prepared: Prepared) -> None:
        """Queue the request; raises (overloaded, too large for the batch) before any token."""

    @abstractmethod
    def shutdown(self, timeout: float = 10.0) -> None: ...

    async def open(self, prompt: Union[str, list[int]], params: SamplingParams, messages: Any = None,
                   request_id: Optional[str] = None) -> AsyncGenerator[RequestOutput, None]:
        """The service's entry point, for a prompt or chat messages. Errors raise here,
        before the first chunk; the request is aborted as soon as the caller stops
        iterating (disconnect, cancel, error). A request with `resume_tokens` goes on from them
        exactly as an uncut run would (counter-based sampling: sampling.py)."""
        stream = self._new_stream(request_id, params)
        prepared = await asyncio.get_running_loop().run_in_executor(
            self._prepare, self.preparer.prepare, prompt, params, messages)
        await self._submit(stream, prepared)
        return self._iterator(stream)

    async def tokenize(self, prompt: Union[str, list[int]], params: SamplingParams, messages: Any = None) -> list[int]:
        """The prompt's token ids as a request with these options would have them (chat rendered);
        raises ValidationError naming the field."""
        return await asyncio.get_running_loop().run_in_executor(
            self._prepare, self.preparer.tokenize, prompt, params, messages)

    def detokenize(self, ids: list[int]) -> str:
        """Token ids (the model's) as text, special tokens included."""
        vocab = len(self.tokenizer)
        check(bool(ids) and all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in ids),
              "prompt_token_ids", f"must be a non-empty list of token ids from 0 to {vocab - 1}")
        return str(self.tokenizer.decode(ids))

    async def complete(self, prompt: Union[str, list[int]], params: SamplingParams, messages: Any = None,
                       request_id: Optional[str] = None) -> list[RequestOutput]:
        """The whole answers, one output each in choice order (unary calls); raises as `open`
        does, or GenerationError when it fails midway. Cancelling the caller aborts it at once."""
        async with aclosing(await self.open(prompt, params, messages, request_id)) as stream:
            return by_choice([out async for out in stream])

    def _new_stream(self, request_id: Optional[str], params: SamplingParams) -> RequestStream:
        if not self.healthy:
            raise EngineDeadError("the decode loop is not running")
        interval = params.stream_interval if isinstance(params.stream_interval, int) else self.config.stream_interval
        return RequestStream(request_id or uuid.uuid4().hex, asyncio.get_running_loop(),
                             interval=max(1, interval), interval_s=self.config.stream_interval_ms / 1000,
                             choices=params.n if isinstance(params.n, int) and params.n > 0 else 1)

    def _iterator(self, stream: RequestStream) -> AsyncGenerator[RequestOutput, None]:
        iterator = self._iterate(stream)
        # a stream dropped before its first read never runs its `finally`: abort it then too
        weakref.finalize(iterator, self._abort_unfinished, stream)
        return iterator

    async def _iterate(self, stream: RequestStream) -> AsyncGenerator[RequestOutput, None]:
        try:
            while not stream.done:
                yield await stream.next_chunk()
        finally:
            self._abort_unfinished(stream)

    def _abort_unfinished(self, stream: RequestStream) -> None:
        if not stream.done:
            stream.done = True
            self.abort(stream.request_id)
