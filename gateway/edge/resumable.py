"""Streams that survive a dropped connection. Every event of an SSE stream carries an id,
`<stream>/<n>`; a request that sends `Last-Event-ID` with one gets the events after it, then the
rest of the answer, as if the connection had never dropped.

A stream's events are made by a task of their own (the protocol's encoder over the executor's
documents), apart from the connection that reads them. When the reader goes, the generation is
cancelled at once, as before, and its batch slot freed; the encoder waits. A reconnect replays
the events made after the id it names, and the executor goes on from the tokens already encoded
(`resume_tokens`, with the seed the answer is sampled with: a sampled request without one gets
one drawn here). Sampling is a function of the seed and the position, so the encoder's next
events are the very ones an unbroken stream would have had.

A stream is kept `resume_seconds` after its reader left or it ended, within `resume_streams`
streams and `resume_bytes` of events in all (contract/limits.py); past a bound the stream that
waited longest without a reader goes first. The Responses API's `background` streams use the same
store, made whoever reads them (gateway/protocols/responses_stored.py). A stream with several
answers (`n` > 1) cannot go on from tokens: its events are replayed, but a cut one ends with an
error event.
"""
import asyncio
import time
import uuid
import weakref
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Optional

from contract import kind_of
from contract.limits import ResumeLimits, draw_seed
from gateway.edge.backend import Ends, close_quietly, error_doc
from gateway.mapping.policies import Handed, sampled
from schemas import ModelOutputDocument, PromptDocument, Seed

Opener = Callable[[PromptDocument], Awaitable[tuple[ModelOutputDocument, AsyncIterator[ModelOutputDocument]]]]
Labeller = Callable[[str, str], str]  # (event id, frame) -> the frame as sent, carrying its id


def sse_labelled(event_id: str, frame: str) -> str:
    """An SSE frame with its `id:` line, which a browser's EventSource sends back as Last-Event-ID."""
    return f"id: {event_id}\n{frame}"


def with_seed(doc: PromptDocument) -> PromptDocument:
    """A sampled request without a seed gets one, so that it can go on from its tokens."""
    if doc.seed is None and sampled(doc.do_sample, doc.temperature):
        return doc.model_copy(update={"seed": Seed(draw_seed())})
    return doc


class ResumableDocs:
    """The executor's documents for one stream; after `cut`, `resume` goes on from the tokens of
    the documents handed on so far.

    Each call to the executor is made and read by a pump task of its own, which lives as long as
    the call: the gateway ends a call when the task that made it ends (jina_patches.py), and
    a stream moved off a lost replica opens its new call from inside that reading. Cutting
    cancels the pump, which ends the call; documents it had read but not handed on are dropped,
    and made again on the resume."""

    def __init__(self, open_: Opener, doc: PromptDocument):
        self._open, self._doc = open_, doc
        self._ends = Ends.of(doc)
        self._queue: asyncio.Queue[Optional[ModelOutputDocument]] = asyncio.Queue(maxsize=1)  # None: the call ended
        self._pump: Optional[asyncio.Task] = None
        self._live = asyncio.Event()
        self.handed = Handed(doc.resume_tokens or ())  # what a resumed run goes on from
        self.over = False

    @property
    def tokens(self) -> list[int]:
        """The tokens handed on by this stream."""
        return self.handed.tokens

    @property
    def text(self) -> str:
        """The text handed on by this stream."""
        return self.handed.text

    async def start(self) -> ModelOutputDocument:
        """Open the call; its first document (which stays the first handed on)."""
        self._pump_from(self._doc)
        first = await self._queue.get()
        assert first is not None  # the opener gives a first document, or raises
        self._queue.put_nowait(first)  # the pump waits for room: nothing came between
        return first

    def _pump_from(self, doc: PromptDocument) -> None:
        self._live.set()
        self._pump = asyncio.ensure_future(self._run(doc))

    async def _run(self, doc: PromptDocument) -> None:
        rest: Optional[AsyncIterator[ModelOutputDocument]] = None
        try:
            first, rest = await self._open(doc)
            await self._queue.put(first)
            async for out in rest:
                await self._queue.put(out)
        except Exception as exc:  # noqa: BLE001 - the stream ends with it, as an error document
            await self._queue.put(error_doc(f"{type(exc).__name__}: {exc}", kind_of(exc)))
        else:
            await self._queue.put(None)
        finally:
            if rest is not None:
                await close_quietly(rest)

    def __aiter__(self) -> "ResumableDocs":
        return self

    async def __anext__(self) -> ModelOutputDocument:
        out = None if self.over else await self._queue.get()
        if out is None:
            self.over = True
            raise StopAsyncIteration
        return self._hand_on(out)

    def _hand_on(self, out: ModelOutputDocument) -> ModelOutputDocument:
        if self.handed.prefix:
            out = out.model_copy(update={"generated_text": self.handed.generated_text(out.generated_text)})
        self.handed.sent(list(out.token_ids), out.text)
        self.over = self._ends.last(out)
        return out

    def cut(self) -> None:
        """The reader left: the generation stops now (its call ends with its pump)."""
        if self.over or not self._live.is_set():
            return
        self._live.clear()
        if self._pump is not None:
            self._pump.cancel()
        while not self._queue.empty():  # read from the executor, never handed on: made again
            self._queue.get_nowait()

    async def resume(self) -> None:
        """A reader is back: the executor goes on from the tokens handed on so far."""
        if self.over or self._live.is_set():
            return
        await self.close()
        if self._doc.n not in (None, 1):
            self._live.set()
            await self._queue.put(error_doc("the stream was cut, and an answer of several (n) cannot go on "
                                            "from its tokens"))
            return
        self._pump_from(self._doc.model_copy(update={"resume_tokens": self.handed.resume_tokens()}))

    async def close(self) -> None:
        """The call ended, whatever it was doing."""
        if self._pump is not None:
            self._pump.cancel()
            await asyncio.gather(self._pump, return_exceptions=True)


@dataclass
class StoredStream:
    id: str
    route: str  # the path it was made on: a reconnect comes back there
    docs: ResumableDocs
    frames: list[str] = field(default_factory=list)
    size: int = 0
    done: bool = False
    readers: int = 0
    background: bool = False  # made whoever reads it (Responses' background): a reader leaving cuts nothing
    cancelled: bool = False
    idle_since: float = field(default_factory=time.monotonic)
    producer: Optional[asyncio.Task] = None
    label: Labeller = sse_labelled
    on_cancel: Optional[Callable[["StoredStream"], str]] = None  # the last frame of a cancelled stream
    context: Any = None  # what the route keeps beside the events (the WebSocket chat: its conversation)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    def append(self, frame: str) -> None:
        self.frames.append(self.label(f"{self.id}/{len(self.frames)}", frame))
        self.size += len(self.frames[-1])
        self._changed.set()
        self._changed = asyncio.Event()

    def end(self) -> None:
        self.done, self.idle_since = True, time.monotonic()
        self._changed.set()

    async def changed(self) -> None:
        await self._changed.wait()


class StreamStore:
    """The streams kept for a reconnect, within ResumeLimits."""

    def __init__(self, limits: Optional[ResumeLimits] = None):
        self.limits = limits or ResumeLimits.from_env()
        self._streams: OrderedDict[str, StoredStream] = OrderedDict()

    def start(self, route: str, docs: ResumableDocs, frames: AsyncIterator[str], stream_id: Optional[str] = None,
              background: bool = False, **kept: Any) -> StoredStream:
        """A new stream, its events made from now on by a task of its own. `kept`: StoredStream's
        label, on_cancel and context."""
        self._evict(keep=1)
        stored = StoredStream(stream_id or "strm_" + uuid.uuid4().hex, route, docs, background=background, **kept)
        stored.producer = asyncio.ensure_future(self._produce(stored, frames))
        self._streams[stored.id] = stored
        return stored

    def find(self, route: str, last_event_id: str) -> Optional[tuple[StoredStream, int]]:
        """The stream of `route` that `Last-Event-ID` names, and the event after which to go on."""
        stream_id, _, index = last_event_id.strip().rpartition("/")
        stored = self.by_id(route, stream_id)
        if stored is None or not index.isdigit() or int(index) >= len(stored.frames):
            return None
        return stored, int(index) + 1

    def by_id(self, route: str, stream_id: str) -> Optional[StoredStream]:
        self._evict(keep=0)
        stored = self._streams.get(stream_id)
        return stored if stored is not None and stored.route == route else None

    async def cancel(self, stored: StoredStream) -> None:
        """Stop making its events (and its generation); what was made stays."""
        if stored.producer is not None and not stored.producer.done():
            stored.cancelled = True
            stored.producer.cancel()
            await asyncio.gather(stored.producer, return_exceptions=True)

    def forget(self, stored: StoredStream) -> None:
        self._streams.pop(stored.id, None)

    async def read(self, stored: StoredStream, start: int) -> AsyncGenerator[str, None]:
        """The stream's events from `start` on, to its end; when this reader goes, the generation
        stops until the next one comes."""
        stored.readers += 1
        await stored.docs.resume()
        try:
            index = start
            while True:
                while index < len(stored.frames):
                    yield stored.frames[index]
                    index += 1
                if stored.done:
                    return
                await stored.changed()
        finally:
            stored.readers -= 1
            if stored.readers == 0 and not stored.background:
                stored.idle_since = time.monotonic()
                stored.docs.cut()

    @property
    def size(self) -> int:
        return sum(s.size for s in self._streams.values())

    def __len__(self) -> int:
        return len(self._streams)

    async def _produce(self, stored: StoredStream, frames: AsyncIterator[str]) -> None:
        try:
            async for frame in frames:
                stored.append(frame)
        finally:
            if stored.cancelled and stored.on_cancel is not None:
                stored.append(stored.on_cancel(stored))
            stored.end()
            await stored.docs.close()

    def _evict(self, keep: int) -> None:
        """Streams past their time, then (while over a bound, leaving room for `keep` more) the
        readerless one that waited longest."""
        now, limits, size = time.monotonic(), self.limits, self.size
        idle = sorted((s for s in self._streams.values() if s.readers == 0 and (s.done or not s.background)),
                      key=lambda s: s.idle_since)
        for stored in idle:
            over = len(self._streams) + keep > limits.resume_streams or size > limits.resume_bytes
            if now - stored.idle_since > limits.resume_seconds or over:
                self._drop(stored)
                size -= stored.size

    def _drop(self, stored: StoredStream) -> None:
        del self._streams[stored.id]
        if stored.producer is not None and not stored.producer.done():
            stored.producer.cancel()


_STORES: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, StreamStore]" = weakref.WeakKeyDictionary()


def streams() -> StreamStore:
    """The store of the running event loop: the gateway's one loop (a test's app may run each
    request in a loop of its own, and a task lives in its loop)."""
    loop = asyncio.get_running_loop()
    if loop not in _STORES:
        _STORES[loop] = StreamStore()
    return _STORES[loop]
