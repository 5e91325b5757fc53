"""The decode loop in a process of its own, as vLLM v1's engine core is.

Serving work per token (the executor's documents, their protobuf, gRPC) then runs in this
process while the next step runs in the other, instead of taking turns under one
interpreter lock. The pipes carry one message per step for all rows (core_process.py);
requests are prepared here, so only token ids cross. A reader thread feeds each request's
RequestStream; a sender thread writes commands, so the event loop never blocks on the pipe.
If the engine process dies, requests in flight fail at once and a new one is started.
"""
import asyncio
import logging
import os
import queue
import subprocess
import sys
import threading
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Optional

from .async_engine import EngineClient
from .errors import EngineDeadError, OverloadedError
from .observer import EngineObserver
from .params import EngineConfig
from .prepare import Prepared, Preparer
from .request import TokenOutput
from .streams import RequestStream

log = logging.getLogger(__name__)
_ROOT = str(Path(__file__).resolve().parents[2])  # holds the `executors` package


class EngineProcess(EngineClient):
    def __init__(self, config: EngineConfig, observer: Optional[EngineObserver] = None):
        super().__init__(config)
        self.observer = observer or EngineObserver()
        self.process_restarts = 0
        self._streams: dict[str, RequestStream] = {}
        self._acks: dict[str, asyncio.Future] = {}
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()  # bounded by _submit's check
        self._stats: dict = {}
        self._stopping = False
        self._dead: Optional[str] = None
        self._start()  # raises when the model does not load
        self._reader = threading.Thread(target=self._read, name="llm-engine-reader", daemon=True)
        self._reader.start()
        threading.Thread(target=self._send, name="llm-engine-sender", daemon=True).start()

    # ----- the process -----
    def _start(self) -> None:
        """Start an engine process and wait for its model (seconds)."""
        cmd_read, cmd_write = os.pipe()
        out_read, out_write = os.pipe()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [_ROOT, os.environ.get("PYTHONPATH")]))}
        self._process = subprocess.Popen(
            [sys.executable, "-m", "executors.engine.core_process", str(cmd_read), str(out_write)],
            pass_fds=(cmd_read, out_write), env=env)
        os.close(cmd_read)
        os.close(out_write)
        self._commands = Connection(cmd_write, readable=False)
        self._outputs = Connection(out_read, writable=False)
        self._commands.send(self.config)
        try:
            reply = self._outputs.recv()
        except EOFError:
            reply = ("failed", f"the engine process exited with code {self._process.wait()} while loading")
        if reply[0] == "failed":
            self._process.wait()
            raise RuntimeError(reply[1])
        _, self.info, tokenizer, self._stats = reply
        self.preparer = Preparer(tokenizer, self.config, self.info.max_context)

    def _read(self) -> None:
        """Deliver every step's outputs; when the process dies, fail its requests and restart."""
        while True:
            try:
                message = self._outputs.recv()
            except (EOFError, OSError):
                if self._stopping or not self._restart():
                    return
                continue
            try:
                self._deliver(*message)
            except Exception:  # noqa: BLE001 - one bad message must not stop every stream
                log.exception("could not deliver the engine's outputs")

    def _deliver(self, acks: list, tokens: list[TokenOutput], events: list, stats: dict) -> None:
        for request_id, error in acks:
            self._settle(request_id, error)
        for out in tokens:
            stream = self._streams.get(out.request_id)
            if stream is not None:
                if out.ends:
                    self._streams.pop(out.request_id, None)
                stream.push(out)
        for hook, args in events:
            getattr(self.observer, hook)(*args)
        self._stats = stats

    def _restart(self) -> bool:
        code = self._process.wait()
        message = f"the engine process exited unexpectedly (code {code})"
        log.error("%s; failing its requests and starting a new one", message)
        self._dead = message
        self._fail_all(message)
        self._commands.close()
        self._outputs.close()
        try:
            self._start()
        except Exception:  # noqa: BLE001 - stays unhealthy: /health says so
            log.exception("could not restart the engine process")
            return False
        self.process_restarts += 1
        self._dead = None
        return True

    def _fail_all(self, message: str) -> None:
        for request_id in list(self._acks):
            self._settle(request_id, EngineDeadError(message))
        streams, self._streams = self._streams, {}
        for request_id, stream in streams.items():
            stream.push(TokenOutput.failure(request_id, message))

    def _settle(self, request_id: str, error: Optional[BaseException]) -> None:
        future = self._acks.pop(request_id, None)
        if future is not None:
            future.get_loop().call_soon_threadsafe(_set_outcome, future, error)

    def _send(self) -> None:
        while (command := self._outbox.get()) is not None:
            try:
                self._commands.send(command)
            except OSError:  # the process died: the reader fails its requests and restarts it
                if command[0] == "add":  # this one never reached it: fail it here
                    self._settle(command[1], EngineDeadError("the engine process exited; retry"))

    # ----- the EngineClient interface -----
    @property
    def healthy(self) -> bool:
        return self._dead is None and not self._stopping

    def stats(self) -> dict:
        return {**self._stats, "process_restarts": self.process_restarts, "healthy": self.healthy}

    async def _submit(self, stream: RequestStream, prepared: Prepared) -> None:
        if not self.healthy:
            raise EngineDeadError(self._dead or "the engine is shutting down")
        if len(self._streams) >= self.config.max_running + self.config.max_waiting:
            raise OverloadedError(f"overloaded: {len(self._streams)} requests in flight, retry later")
        request_id = stream.request_id
        ack = asyncio.get_running_loop().create_future()
        self._acks[request_id], self._streams[request_id] = ack, stream
        self._outbox.put(("add", request_id, prepared))
        try:
            await ack
        except BaseException:  # refused, or the caller went away while it was queued
            self.abort(request_id)
            raise

    def abort(self, request_id: str) -> None:
        if self._streams.pop(request_id, None) is not None:
            self._outbox.put(("abort", request_id))

    def shutdown(self, timeout: float = 10.0) -> None:
        """Ask the process to fail what is in flight and exit; kill it if it does not."""
        self._stopping = True
        self._outbox.put(("stop",))
        self._outbox.put(None)
        try:
            self._process.wait(timeout)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._reader.join(timeout)
        self._prepare.shutdown(wait=False, cancel_futures=True)

    @property
    def pid(self) -> int:
        return self._process.pid


def _set_outcome(future: asyncio.Future, error: Any) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)
