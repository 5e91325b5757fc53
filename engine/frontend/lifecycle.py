"""One model's life in a serving process: loaded when a request needs it, unloaded when it has
been idle for its keep-alive, as Ollama and LM Studio do.

The engine (its process, the weights, the KV cache) exists only while loaded. `using` hands a
request the engine, loading it first when it is not (a request for an unloaded model waits for
the load; a load that fails raises EngineDeadError, and the next request tries again). When the
last request in flight ends, the model's expiry is set from that request's `keep_alive`, or the
server's (EngineConfig.keep_alive: "5m" by default; negative: never; 0: at once), and a timer
unloads it then unless another request came. Unloading shuts the engine down: its process exits,
and the memory of its weights and cache goes back to the system; a spare engine process then
starts (spare.py), its imports done before the next request needs it, so that this request waits
for the model's load alone.

A load runs as a task of its own, which every request for the model waits on: a request that goes
away while it waits leaves the load to finish for the next one (its engine is never lost), and a
load that fails fails every request that waited on it, naming the model.

Every method runs on the serving event loop, apart from the load and the shutdown, which run on a
thread under `_lock`, so that a request never meets a model half loaded or half unloaded.
"""
import asyncio
import enum
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Optional

from contract import EngineDeadError
from contract.keep_alive import FOREVER, keep_alive_seconds

from .async_engine import EngineClient
from .spare import SpareCore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Lease:
    """One request's hold on the loaded model."""

    engine: EngineClient
    load_wait_s: Optional[float]  # how long it waited for the model to load; None: it was loaded


class ModelState(enum.StrEnum):
    LOADED = "loaded"
    LOADING = "loading"
    UNLOADED = "unloaded"


class ModelLifecycle:
    def __init__(self, start: Callable[[], EngineClient], keep_alive_s: float,
                 on_load: Optional[Callable[[EngineClient], None]] = None, name: str = "the model",
                 spare: Optional[SpareCore] = None, on_wait: Optional[Callable[[float], None]] = None):
        self._start, self._on_load = start, on_load or (lambda engine: None)
        self.name = name  # what a failed load's error names
        self.keep_alive_s = keep_alive_s  # the server's, for requests that do not say
        self.spare = spare  # filled at each unload, for the next load to take
        self._on_wait = on_wait or (lambda seconds: None)  # a request's wait for a load, in seconds
        self.engine: Optional[EngineClient] = None
        self.status = ModelState.UNLOADED
        self.loads = self.unloads = 0
        self.load_seconds: Optional[float] = None  # the last load's, from its start to its engine ready
        self._in_flight = 0
        self._expires_at = FOREVER  # time.time() of the unload to come (FOREVER: none)
        self._timer: Optional[asyncio.TimerHandle] = None
        self._lock = asyncio.Lock()
        self._loading: Optional[asyncio.Future] = None  # the load under way
        self._closed = False

    def load_now(self) -> EngineClient:
        """Load at once, on this thread (the process's start: a model that cannot load stops it).
        On a serving loop its keep-alive runs from now, so that a model no request ever asks for
        unloads too; elsewhere (a script) the first request's end sets it."""
        started = time.monotonic()
        self._loaded(self._start(), time.monotonic() - started)
        assert self.engine is not None
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return self.engine
        self.keep()
        return self.engine

    @asynccontextmanager
    async def using(self, keep_alive: Optional[float] = None) -> AsyncIterator[EngineClient]:
        """The loaded engine for one request; its end sets the model's expiry from `keep_alive`."""
        async with self.lease(keep_alive) as held:
            yield held.engine

    @asynccontextmanager
    async def lease(self, keep_alive: Optional[float] = None) -> AsyncIterator["Lease"]:
        """As `using`, with how long this request waited for the model to load (Ollama's load_duration)."""
        self._in_flight += 1
        self._cancel_timer()
        try:
            yield Lease(*await self._ensure_loaded())
        finally:
            self._in_flight -= 1
            self.keep(keep_alive)

    def keep(self, keep_alive: Optional[float] = None) -> None:
        """From now on, stay loaded `keep_alive` seconds after the last request (the server's
        keep-alive when None; negative: for good); 0 unloads once nothing is in flight."""
        seconds = keep_alive_seconds(keep_alive) if keep_alive is not None else self.keep_alive_s
        assert seconds is not None
        self._expires_at = time.time() + seconds if seconds != FOREVER else FOREVER
        self._cancel_timer()
        if self._in_flight == 0 and self.status is ModelState.LOADED and self._expires_at != FOREVER:
            self._timer = asyncio.get_running_loop().call_later(seconds, self._expire)

    async def load(self, keep_alive: Optional[float] = None) -> None:
        """Load (if it is not) and keep it for `keep_alive`: Ollama's request that only loads."""
        async with self.using(keep_alive):
            pass

    @property
    def expires_at(self) -> Optional[float]:
        """When it unloads (time.time()), if it is loaded, idle and due to."""
        loaded_idle = self.status is ModelState.LOADED and self._in_flight == 0
        return self._expires_at if loaded_idle and self._expires_at != FOREVER else None

    def abort(self, request_id: str) -> None:
        if self.engine is not None:
            self.engine.abort(request_id)

    async def _ensure_loaded(self) -> tuple[EngineClient, Optional[float]]:
        """The engine, once loaded, and how long this request waited for a load (None: it did not;
        it tells `on_wait` too)."""
        started = time.monotonic()
        waited = False
        while self.engine is None or self.status is not ModelState.LOADED:
            waited = True
            if self._loading is None:
                self._loading = asyncio.ensure_future(self._load())
                self._loading.add_done_callback(_retrieved)
            await asyncio.shield(self._loading)  # leaving, this request leaves the load to run on
        if not waited:
            return self.engine, None
        seconds = time.monotonic() - started
        self._on_wait(seconds)
        return self.engine, seconds

    async def _load(self) -> None:
        """Load the model (after an unload under way), once for every request waiting on it."""
        try:
            async with self._lock:
                if self._closed:
                    raise EngineDeadError(f"model: {self.name} is not served: the service is stopping")
                if self.engine is not None:
                    return
                self.status = ModelState.LOADING
                started = time.monotonic()
                try:
                    engine = await asyncio.to_thread(self._start)
                except Exception as exc:  # noqa: BLE001 - these requests fail; the next one tries again
                    self.status = ModelState.UNLOADED
                    log.error("%s could not load: %s", self.name, exc)
                    raise EngineDeadError(f"model: could not load {self.name}: {exc}") from exc
                if self._closed:  # the service stopped while it loaded
                    await asyncio.to_thread(engine.shutdown)
                    self.status = ModelState.UNLOADED
                    raise EngineDeadError(f"model: {self.name} is not served: the service is stopping")
                self._loaded(engine, time.monotonic() - started)
        finally:
            self._loading = None

    def _loaded(self, engine: EngineClient, seconds: float) -> None:
        self.engine, self.status = engine, ModelState.LOADED
        self.loads += 1
        self.load_seconds = seconds
        self._on_load(engine)

    def _expire(self) -> None:
        self._timer = None
        if self._in_flight == 0 and self.engine is not None:
            asyncio.get_running_loop().create_task(self.unload())

    async def unload(self) -> None:
        """Shut the engine down and free its memory, unless a request came meanwhile."""
        async with self._lock:
            if self.engine is None or self._in_flight:
                return
            engine, self.engine = self.engine, None
            log.info("the model unloads after its keep-alive")
            await asyncio.to_thread(engine.shutdown)  # its process gone, and its memory with it
            if self.spare is not None:
                await asyncio.to_thread(self.spare.fill)  # milliseconds: its imports run in its own process
            self.status = ModelState.UNLOADED
            self.unloads += 1

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def shutdown(self) -> None:
        """The process stops: the engine with it, and the spare, whatever their state (a load
        under way shuts its engine down when it ends)."""
        self._closed = True
        self._cancel_timer()
        if self.spare is not None:
            self.spare.close()
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None


def _retrieved(load: asyncio.Future) -> None:
    """A failed load's error is read even when every request that waited on it has gone."""
    if not load.cancelled():
        load.exception()
