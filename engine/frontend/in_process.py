"""The decode loop on a thread of the caller's process, for tests, benchmarks and scripts. It is
kept apart from EngineClient so that the executor, whose engine runs in a process of its own,
never imports the engine core, the kernels or transformers' models."""
import threading
from collections.abc import AsyncGenerator
from concurrent.futures import Future
from typing import Optional

from contract import EngineConfig, SamplingParams

from ..core.core import EngineCore
from ..messages import Prepared
from ..model.loader import LoadedModel, load_model
from ..observer import EngineObserver
from ..outputs import RequestOutput
from .async_engine import EngineClient
from .prepare import Preparer
from .streams import RequestStream


class AsyncEngine(EngineClient):
    """The decode loop on a thread of this process: for tests, benchmarks and scripts."""

    def __init__(self, config: EngineConfig, loaded: Optional[LoadedModel] = None,
                 observer: Optional[EngineObserver] = None):
        super().__init__(config)
        self._wake = threading.Condition()
        self._stopping = False
        started: Future[EngineCore] = Future()
        self._thread = threading.Thread(target=self._run, args=(loaded, started), name="llm-decode-loop",
                                        daemon=True)
        self._thread.start()
        self.core = started.result()  # raises what loading raised
        self.info = self.core.loaded.info
        self.preparer = Preparer(self.core.tokenizer, self.config, self.info.max_context, self.core.grammars)
        if observer is not None:
            self.core.observer = observer

    @property
    def observer(self) -> EngineObserver:
        return self.core.observer

    @observer.setter
    def observer(self, observer: EngineObserver) -> None:
        self.core.observer = observer

    @property
    def healthy(self) -> bool:
        return self._thread.is_alive() and not self._stopping

    @property
    def loop_restarts(self) -> int:
        return self.core.loop_restarts

    def stats(self) -> dict:
        return {**self.core.stats(), "healthy": self.healthy}

    def generate(self, prompt: str, params: SamplingParams,
                 request_id: Optional[str] = None) -> AsyncGenerator[RequestOutput, None]:
        """`open` for a prompt, tokenized on the calling thread: tests and scripts."""
        stream = self._new_stream(request_id, params)
        self._add(stream, self.preparer.prepare(prompt, params))
        return self._iterator(stream)

    async def _submit(self, stream: RequestStream, prepared: Prepared) -> None:
        self._add(stream, prepared)

    def _add(self, stream: RequestStream, prepared: Prepared) -> None:
        self.core.add(stream.request_id, prepared, stream.push)
        with self._wake:
            self._wake.notify()

    def abort(self, request_id: str) -> None:
        self.core.abort(request_id)
        with self._wake:
            self._wake.notify()

    def _run(self, loaded: Optional[LoadedModel], started: "Future[EngineCore]") -> None:
        """The model loads on this thread too. torch's OpenMP keeps a thread team per thread
        that runs parallel work; two teams are more threads than 2 cores, and OpenMP then
        stops spinning between ops: SmolLM2's decode step took 68 ms instead of 40 when it
        loaded on the caller's thread and ran on this one (measured)."""
        try:
            core = EngineCore(loaded or load_model(self.config), self.config)
        except BaseException as exc:
            started.set_exception(exc)
            return
        started.set_result(core)
        while not self._stopping:
            with self._wake:
                while not self._stopping and not core.has_work:
                    self._wake.wait(timeout=1.0)
            if not self._stopping:
                core.safe_step()
        core.fail_all("the engine is shutting down", close=True)
        core.close()

    def shutdown(self, timeout: float = 10.0) -> None:
        self._stopping = True
        with self._wake:
            self._wake.notify_all()
        self._thread.join(timeout)
        self._prepare.shutdown(wait=False, cancel_futures=True)
