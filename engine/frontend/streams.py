"""Per-request async streams: the decode loop pushes, a reader awaits.

The decode thread (AsyncEngine), or the event loop that reads the engine process's
messages, pushes tokens without ever blocking, and a slow reader receives everything
pending as one coalesced chunk, so memory stays bounded by max_tokens and a slow client
never slows the batch. A request with n answers gets each answer's tokens in chunks of their
own, and ends when every answer has ended.
"""
import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..outputs import RequestOutput


@dataclass
class RequestStream:
    request_id: str
    loop: asyncio.AbstractEventLoop
    _pending: list[RequestOutput] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    done: bool = False
    interval: int = 1  # tokens per chunk at least (the last may carry fewer): stream_interval
    interval_s: float = 0.0  # and at least this long since the previous chunk: stream_interval_ms
    _signalled: bool = False  # the reader was woken and has not taken the pending tokens yet
    _sent_at: float = 0.0
    choices: int = 1  # the request's n
    _ended: int = 0  # answers whose last output was pushed
    _read: int = 0  # answers whose last output was read

    @property
    def ended(self) -> bool:
        """Its last output was pushed: every answer ended, or one failed (which ends them all)."""
        return self._ended >= self.choices

    def push(self, out: RequestOutput) -> None:
        """Engine thread: never blocks, wakes the reader once a chunk is due (or the request
        ended), at most once per chunk."""
        with self._lock:
            self._ended = self.choices if out.error is not None else self._ended + out.ends
            self._pending.append(out)
            wake = not self._signalled and (out.ends or self._due())
            self._signalled |= wake
        if wake:
            run_on(self.loop, self._wakeup.set)

    def _due(self) -> bool:
        if len(self._pending) < self.interval:
            return False
        if self.interval_s:
            now = time.monotonic()
            if now - self._sent_at < self.interval_s:
                return False
            self._sent_at = now
        return True

    async def next_chunk(self) -> RequestOutput:
        """Everything the reader had not taken yet, as one output: usually one token,
        several when it fell behind."""
        await self._wakeup.wait()
        with self._lock:
            items, self._pending = self._pending, []
            self._wakeup.clear()
            self._signalled = False
        tokens = [o for o in items if o.error is None]
        errors = [o for o in items if o.error is not None]
        if errors and not tokens:
            self.done = True
            raise errors[0].exception()
        mine = [o for o in tokens if o.choice == tokens[0].choice]
        later = [o for o in tokens if o.choice != tokens[0].choice] + errors
        if later:  # other answers' tokens, then the error, on the next reads
            with self._lock:
                self._pending = later + self._pending
                self._signalled = True
                self._wakeup.set()
        merged = RequestOutput.merge(mine)
        self._read += merged.finish_reason is not None
        self.done = self._read >= self.choices
        return merged


def run_on(loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any) -> None:
    """fn(*args) on `loop`: at once when called on its thread (the engine process's outputs
    are read there), else through its self-pipe. A closed loop has nobody left to tell."""
    if asyncio._get_running_loop() is loop:
        fn(*args)
        return
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # the event loop is closed
        pass
