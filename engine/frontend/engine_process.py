"""The decode loop in a process of its own, as vLLM v1's engine core is.

Serving work per token (the executor's documents, their protobuf, gRPC) then runs in this
process while the next step runs in the other, instead of taking turns under one
interpreter lock. The pipes carry one message per step for all rows (core_process.py);
requests are prepared here, so only token ids cross. The event loop of the requests reads
the steps' messages itself (`add_reader`), every one waiting at each wake-up, and feeds each
request's RequestStream: a reader thread cost a second wake-up per step (the thread, then
the loop). A sender thread writes
commands, so the loop never blocks on a full pipe. A watcher thread waits on the process: if
it dies, requests in flight fail at once and a new one is started.

Lifecycle, who owns what:
- the engine process owns the model, the KV cache and the scheduler; it is started in
  `__init__` (which waits for its `Ready`) and again by the watcher after a crash;
- the event loop of the requests owns `_streams` and `_acks` (requests in flight), and reads
  the outputs pipe (`_read_on`: the first loop that submits reads it);
- the sender thread alone writes the commands pipe, from `_outbox`;
- the watcher thread alone waits on the process. On a crash it fails every request in
  flight (`_fail_all`), starts a new process (the model loads again, seconds), and hands the
  new pipe to the loop that read the old one. Requests that arrive meanwhile are refused
  (`healthy` is False), never queued for a process that does not exist;
- the watchdog thread alone judges a stall: requests in flight, and no message from the process
  for LLM_ENGINE_STALL_S seconds (a step takes milliseconds to a second or two). It has the process
  write every thread's stack to the log (faulthandler, on SIGUSR1), then kills it: the watcher
  fails its requests and starts another, as after a crash. /stats says how old its numbers are
  (`stats_age_s`), so a frozen step count reads as what it is.
The messages both ways are messages.py's dataclasses.
"""
import asyncio
import logging
import os
import queue
import signal
import subprocess
import threading
import time
from multiprocessing.connection import Connection
from typing import Any, Optional

from contract import EngineConfig, EngineDeadError, OverloadedError, settings
from contract.memory import give_back_freed

from ..messages import (
    AbortRequest,
    AddRequest,
    Command,
    LoadFailed,
    LoadModel,
    Prepared,
    Ready,
    Shutdown,
    StepOutputs,
    TokenizerKept,
    TokenizerLoaded,
    replay,
)
from ..observer import EngineObserver
from ..outputs import RequestOutput
from .ahead import EXIT_UNKNOWN
from .async_engine import EngineClient
from .kept_tokenizer import KeptTokenizer
from .prepare import Preparer
from .spare import CoreProcess, SpareCore, spawn_core
from .streams import RequestStream, run_on

log = logging.getLogger(__name__)
MAX_MESSAGES_PER_READ = 64  # steps delivered per loop turn at most, so that the readers' turn comes
STALL_S: float = settings.read("LLM_ENGINE_STALL_S")  # in flight, and silent this long: a stall


class EngineProcess(EngineClient):
    def __init__(self, config: EngineConfig, observer: Optional[EngineObserver] = None,
                 spare: Optional[SpareCore] = None):
        super().__init__(config)
        self._spare = spare  # an engine process started ahead, its imports done: the load takes it
        self.observer = observer or EngineObserver()
        self.process_restarts = 0
        self._streams: dict[str, RequestStream] = {}
        self._acks: dict[str, asyncio.Future] = {}
        self._outbox: queue.SimpleQueue[Optional[Command]] = queue.SimpleQueue()  # bounded by _submit's check
        self._stats: dict = {}
        self._stats_at = time.monotonic()  # when the process last sent a message
        self._busy_since = time.monotonic()  # when requests were last put in flight with none before
        self.stalls = 0
        self._stopping = False
        self._dead: Optional[str] = None
        self._reader: Optional[tuple[asyncio.AbstractEventLoop, Connection]] = None  # who reads which pipe
        self._reader_lock = threading.Lock()
        self._start()  # raises when the model does not load
        self._watcher = threading.Thread(target=self._watch, name="llm-engine-watcher", daemon=True)
        self._watcher.start()
        threading.Thread(target=self._send, name="llm-engine-sender", daemon=True).start()
        threading.Thread(target=self._watchdog, name="llm-engine-watchdog", daemon=True).start()

    # ----- the process -----
    def _start(self) -> None:
        """Start an engine process, or take the spare, and wait for its model (seconds)."""
        asked = time.monotonic()
        core = (self._spare.take() if self._spare is not None else None) or spawn_core()
        self._process, self._commands, self._outputs = core.process, core.commands, core.outputs
        kept = KeptTokenizer(self.config.model)
        self._commands.send(LoadModel(self.config, kept.folder))
        sent = time.monotonic()
        kept.start()  # after the send: its parse holds the interpreter
        early: Any = None  # the tokenizer, when it came before the weights loaded
        try:
            while isinstance(reply := self._outputs.recv(), (TokenizerLoaded, TokenizerKept)):
                early = reply.tokenizer if isinstance(reply, TokenizerLoaded) else kept.result()
        except EOFError:
            reply = LoadFailed(f"the engine process exited{exit_code(self._process.wait())} while loading")
        except RuntimeError as exc:  # the kept tokenizer could not be built on this side
            reply = LoadFailed(str(exc))
        match reply:
            case Ready(info, tokenizer, stats, stages):
                tokenizer = early if tokenizer is None else tokenizer
                self.info, self._stats, self._stats_at = info, stats, time.monotonic()
                self.preparer = Preparer(tokenizer, self.config, info.max_context)
                give_back_freed()  # the tokenizer's unpickling: its parse's temporaries
                self.start_stages = start_stages(core, asked, sent, stages, time.monotonic())
                log.info("engine process ready in %.2f s (%s): %s", self.start_stages["total"],
                         "the spare" if core.spare else "started now",
                         ", ".join(f"{k} {v:.2f} s" for k, v in self.start_stages.items() if k in STAGES))
            case LoadFailed(message):
                core.discard()
                raise RuntimeError(message)
            case _:
                core.discard()
                raise RuntimeError(f"the engine process answered {type(reply).__name__} while loading")

    def _watch(self) -> None:
        """When the process dies, fail its requests and start a new one."""
        while True:
            self._process.wait()
            if self._stopping or not self._restart():
                return

    def _read_on(self, loop: asyncio.AbstractEventLoop) -> None:
        """On `loop`'s thread: read the current pipe there, unless a loop that is still open
        already does. The first request's loop reads it; another takes over once it closes.
        Not while a restart runs: its new pipe first carries the "ready" the watcher waits for,
        and the watcher hands the pipe over afterwards (`_dead` is set before the new pipe
        exists, and cleared after "ready")."""
        with self._reader_lock:
            outputs = self._outputs
            if self._dead is not None or outputs.closed or self._read_by_open_loop(outputs):
                return
            self._reader = (loop, outputs)
            loop.add_reader(outputs.fileno(), self._read_waiting, loop, outputs)

    def _read_by_open_loop(self, outputs: Connection) -> bool:
        """Whether an event loop that is still open reads this pipe (under _reader_lock)."""
        return self._reader is not None and self._reader[1] is outputs and not self._reader[0].is_closed()

    def _read_waiting(self, loop: asyncio.AbstractEventLoop, outputs: Connection) -> None:
        """Deliver every step's outputs that have arrived, before any reader runs: a loop
        that fell k steps behind hands each stream its k tokens as one chunk, not k chunks
        one per loop turn. At EOF (the process died, or was stopped) this loop stops reading
        the pipe and closes it: the watcher starts a new process."""
        for _ in range(MAX_MESSAGES_PER_READ):
            try:
                message = outputs.recv()
            except (EOFError, OSError):
                loop.remove_reader(outputs.fileno())
                outputs.close()
                return
            try:
                self._deliver(message)
            except Exception:  # noqa: BLE001 - one bad message must not stop every stream
                log.exception("could not deliver the engine's outputs")
            if not outputs.poll(0):
                return

    def _deliver(self, step: StepOutputs) -> None:
        for ack in step.acks:
            self._settle(ack.request_id, ack.error)
        for out in step.outputs:
            stream = self._streams.get(out.request_id)
            if stream is not None:
                stream.push(out)
                if stream.ended:
                    self._streams.pop(out.request_id, None)
        for event in step.events:
            replay(event, self.observer)
        self._stats, self._stats_at = step.stats, time.monotonic()

    def _watchdog(self) -> None:
        """Kill a process that stalls with requests in flight (its stacks logged first): the
        watcher then fails them and starts another, instead of their waiting for ever."""
        while not self._stopping:
            time.sleep(min(1.0, STALL_S / 4))
            silent = self.silence()
            if not (self._streams or self._acks) or silent < STALL_S or not self.healthy:
                continue
            process = self._process
            log.error("the engine process sent nothing for %.0f s with %d requests in flight: a stall. Its "
                      "threads' stacks follow; it is then replaced", silent, len(self._streams) + len(self._acks))
            self.stalls += 1
            try:
                os.kill(process.pid, signal.SIGUSR1)
                time.sleep(1.0)  # the stacks reach the log
                process.kill()
            except ProcessLookupError:
                pass
            self._stats_at = time.monotonic()  # the new process's own time starts now

    def silence(self) -> float:
        """Seconds the process has owed an answer: since its last message, or since work
        arrived after an idle spell, whichever is later. An idle process sends nothing, so the
        time since its last message alone would call the first request after a quiet minute a
        stall."""
        return time.monotonic() - max(self._stats_at, self._busy_since)

    def _restart(self) -> bool:
        message = f"the engine process exited unexpectedly{exit_code(self._process.wait())}"
        log.error("%s; failing its requests and starting a new one", message)
        self._dead = message
        self._fail_all(message)
        self._commands.close()
        with self._reader_lock:
            reader = self._reader
            if not self._read_by_open_loop(self._outputs):
                self._outputs.close()  # else the loop reading it closes it, at its EOF
        try:
            self._start()
        except Exception:  # noqa: BLE001 - stays unhealthy: /health says so
            log.exception("could not restart the engine process")
            return False
        self.process_restarts += 1
        self._dead = None
        if reader is not None:  # the new pipe: read where the old was
            run_on(reader[0], self._read_on, reader[0])
        return True

    def _fail_all(self, message: str) -> None:
        for request_id in list(self._acks):
            self._settle(request_id, EngineDeadError(message))
        streams, self._streams = self._streams, {}
        for request_id, stream in streams.items():
            stream.push(RequestOutput.failure(request_id, message))

    def _settle(self, request_id: str, error: Optional[BaseException]) -> None:
        future = self._acks.pop(request_id, None)
        if future is not None:
            run_on(future.get_loop(), _set_outcome, future, error)

    def _send(self) -> None:
        while (command := self._outbox.get()) is not None:
            try:
                self._commands.send(command)
            except OSError:  # the process died: the reader fails its requests and restarts it
                if isinstance(command, AddRequest):  # this one never reached it: fail it here
                    self._settle(command.request_id, EngineDeadError("the engine process exited; retry"))

    # ----- the EngineClient interface -----
    @property
    def healthy(self) -> bool:
        return self._dead is None and not self._stopping

    def stats(self) -> dict:
        return {**self._stats, "process_restarts": self.process_restarts, "healthy": self.healthy,
                "stats_age_s": round(time.monotonic() - self._stats_at, 3), "stalls": self.stalls}

    async def _submit(self, stream: RequestStream, prepared: Prepared) -> None:
        if not self.healthy:
            raise EngineDeadError(self._dead or "the engine is shutting down")
        if len(self._streams) >= self.config.max_running + self.config.max_waiting:
            raise OverloadedError(f"overloaded: {len(self._streams)} requests in flight, retry later")
        request_id = stream.request_id
        loop = asyncio.get_running_loop()
        self._read_on(loop)
        ack = loop.create_future()
        if not (self._streams or self._acks):
            self._busy_since = time.monotonic()  # before the watchdog can see this request in flight
        self._acks[request_id], self._streams[request_id] = ack, stream
        self._outbox.put(AddRequest(request_id, prepared))
        try:
            await ack
        except BaseException:  # refused, or the caller went away while it was queued
            self.abort(request_id)
            raise

    def abort(self, request_id: str) -> None:
        if self._streams.pop(request_id, None) is not None:
            self._outbox.put(AbortRequest(request_id))

    def shutdown(self, timeout: float = 10.0) -> None:
        """Ask the process to fail what is in flight and exit; kill it if it does not."""
        self._stopping = True
        self._outbox.put(Shutdown())
        self._outbox.put(None)
        try:
            self._process.wait(timeout)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._watcher.join(timeout)
        self._prepare.shutdown(wait=False, cancel_futures=True)

    @property
    def pid(self) -> int:
        return self._process.pid


STAGES = ("spawn", "imports", "load", "engine", "handover")  # a start's stages, in order; they add up to its total


def start_stages(core: CoreProcess, asked: float, sent: float, child: dict, received: float) -> dict[str, float]:
    """Where a start's time went (seconds, from time.monotonic() on both sides): `spawn` until its
    config was sent (the process started, or the spare taken), `imports` until the process read it
    (0 for a spare that had done its imports), `load` the model's, `engine` the core's (KV cache,
    scheduler), `handover` until its Ready (the tokenizer, pickled) arrived. `spare` is 1.0 when a
    spare was taken, and `imports_done` how long its imports took from its spawn, waited for or not."""
    config, loaded = child.get("config", sent), child.get("loaded", sent)
    ready, imported = child.get("ready", received), child.get("imported", sent)
    return {"spawn": sent - asked, "imports": max(0.0, config - sent), "load": loaded - config,
            "engine": ready - loaded, "handover": received - ready, "total": received - asked,
            "spare": float(core.spare), "imports_done": imported - core.spawned_at}


def exit_code(code: int) -> str:
    """The words for a process's exit code in a message: none for a claimed process's (ahead.py)."""
    return "" if code == EXIT_UNKNOWN else f" (code {code})"


def _set_outcome(future: asyncio.Future, error: Any) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)
