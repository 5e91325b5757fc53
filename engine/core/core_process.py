"""The engine process: EngineCore's step loop, fed and drained through two pipes.

Run as `python -m engine.core.core_process CMD_FD OUT_FD` by EngineProcess, which
sends `LoadModel` first. It answers `Ready` or `LoadFailed`, then, after every step or
batch of commands, one `StepOutputs`. Commands are `AddRequest`, `AbortRequest` and
`Shutdown` (messages.py). When the other end goes away (even killed with SIGKILL), the pipe
reads EOF and this process exits: none is left behind.

Its imports (torch, transformers, the engine: seconds) come before `LoadModel` is read, so a
process started ahead of its model (a spare: spare.py) has them done when the config comes. `Ready`
says when each stage ended (time.monotonic(), which every process of the machine shares), for the
frontend to log what a load cost and where.
"""
import gc

if __name__ == "__main__":  # run as the engine process: no collection while it imports (prewarm)
    gc.disable()

import faulthandler  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from concurrent.futures import Future, ThreadPoolExecutor  # noqa: E402
from multiprocessing.connection import Connection  # noqa: E402
from typing import Any, Optional  # noqa: E402

import torch  # noqa: E402

from contract import EngineConfig, EngineDeadError, OverloadedError, ValidationError

from ..messages import (
    AbortRequest,
    Ack,
    AddRequest,
    LoadFailed,
    LoadModel,
    Prepared,
    Ready,
    Recorder,
    Shutdown,
    StepOutputs,
    TokenizerKept,
    TokenizerLoaded,
)
from ..model import unused_integrations

unused_integrations.leave_out()  # before transformers' first import: 0.3 s of imports, never used here
from ..model.loader import LoadedModel, load_model  # noqa: E402
from ..outputs import RequestOutput  # noqa: E402
from .core import EngineCore  # noqa: E402

log = logging.getLogger(__name__)
COMPILE_POLL_S = 0.001  # while a grammar compiles and nothing else runs: how often to look


class CoreLoop:
    def __init__(self, core: EngineCore, commands: Connection, outputs: Connection):
        self.core, self.commands, self.outputs = core, commands, outputs
        self.recorder = Recorder()
        core.observer = self.recorder
        self.step = StepOutputs()
        # grammars this process has not compiled yet compile here, off the step loop
        self.compiling: list[tuple[str, Prepared, Future]] = []
        self._compiler = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llm-grammar-compile")

    def run(self) -> None:
        try:
            while self._take_commands(block=not self.core.has_work):
                if self.core.has_work:
                    self.core.safe_step()
                self._flush()
        except (EOFError, OSError):  # the frontend is gone: so is its work
            pass

    def _take_commands(self, block: bool) -> bool:
        """Everything sent so far (waiting for the first when idle); False on `stop`."""
        while self.commands.poll(COMPILE_POLL_S if block and self.compiling else None if block else 0):
            block = False
            match self.commands.recv():
                case AddRequest(request_id, prepared) if not self.core.grammars.cached(prepared.params):
                    future = self._compiler.submit(self.core.grammars.matcher, prepared.params)
                    self.compiling.append((request_id, prepared, future))
                case AddRequest(request_id, prepared):
                    self._add(request_id, prepared)
                case AbortRequest(request_id):
                    self._abort(request_id)
                case Shutdown():
                    self.core.fail_all("the engine is shutting down", close=True)
                    self._flush()
                    return False
        self._add_compiled()
        return True

    def _add_compiled(self) -> None:
        """Queue the requests whose grammar has compiled (or refuse them, naming the field)."""
        done = [c for c in self.compiling if c[2].done()]
        self.compiling = [c for c in self.compiling if not c[2].done()]
        for request_id, prepared, future in done:
            try:
                future.result()  # in the cache now: the rows take their matchers from it
            except ValidationError as exc:
                self.step.acks.append(Ack(request_id, exc))
                continue
            self._add(request_id, prepared)

    def _abort(self, request_id: str) -> None:
        if any(c[0] == request_id for c in self.compiling):  # never queued: settle its ack
            self.compiling = [c for c in self.compiling if c[0] != request_id]
            self.step.acks.append(Ack(request_id))
        self.core.abort(request_id)

    def _add(self, request_id: str, prepared: Prepared) -> None:
        try:
            self.core.add(request_id, prepared, self._emit)
            self.step.acks.append(Ack(request_id))
        except (ValidationError, OverloadedError, EngineDeadError) as exc:  # these pickle
            self.step.acks.append(Ack(request_id, exc))
        except Exception as exc:  # noqa: BLE001 - refused: the frontend raises it for this request
            log.exception("request %s could not be queued", request_id)
            self.step.acks.append(Ack(request_id, RuntimeError(f"{type(exc).__name__}: {exc}")))

    def _emit(self, out: RequestOutput) -> None:
        self.step.outputs.append(out)

    def _flush(self) -> None:
        self.step.events, self.step.stats = self.recorder.events, self.core.stats()
        self.outputs.send(self.step)
        self.step, self.recorder.events = StepOutputs(), []


SMALL_MODEL = 50_000_000  # parameters: below, a CPU decode step is about as short as serving a token


def serving_threads(config: EngineConfig, loaded: LoadedModel) -> Optional[int]:
    """torch's threads for a small model on CPU: every core but one, which serving needs.
    Its steps are so short that serving preempts a torch thread every step, and the others
    then wait for it: on 2 cores the tiny model's engine used 3x the CPU per token with 2
    threads. A larger model's step is long and gains from every core (None: torch's default)."""
    if config.torch_threads is not None or loaded.device.type != "cpu":
        return None
    if loaded.parameters >= SMALL_MODEL:
        return None
    return max(1, len(os.sched_getaffinity(0)) - 1)


def prewarm() -> None:
    """While it waits for its config (a spare waits seconds to minutes): what every load would do
    first, done now. transformers builds its checkpoint renamings (a thousand regular expressions,
    0.1 s) at a model's first load; the imports' objects are frozen, so that the collection after
    the load walks the model's alone. The collector, off while the process imported (its passes
    over the hundreds of thousands of objects that the imports make took 0.6 s of their 4.5 s on
    this project's machine, and freed next to nothing), is on again from here. The imports' garbage is
    frozen with them, not collected first: a collection here found 11,151 unreachable objects of
    the 373,000 it tracks and took 0.2 s, on the start's path where the executor claimed this
    process ahead (ahead_process.py)."""
    try:
        from transformers import conversion_mapping
        conversion_mapping.get_checkpoint_conversion_mapping("llama")
    except Exception:  # noqa: BLE001 - transformers' internals moved: the load builds them then
        log.debug("no checkpoint renamings built ahead", exc_info=True)
    gc.freeze()
    gc.enable()


def serve(commands: Connection, outputs: Connection) -> None:
    prewarm()
    stages = {"imported": time.monotonic()}
    load: LoadModel = commands.recv()
    config = load.config
    stages["config"] = time.monotonic()
    sent: list[bool] = []

    def early(tokenizer: Any) -> None:  # the executor's side has it while the weights load
        if load.tokenizer_from is not None and getattr(tokenizer, "name_or_path", None) == load.tokenizer_from:
            outputs.send(TokenizerKept())  # it built the same from there: nothing to pickle
        else:
            outputs.send(TokenizerLoaded(tokenizer))
        sent.append(True)
    try:
        loaded = load_model(config, early, load.tokenizer_from)  # the executor's side encodes: this one decodes
        stages["loaded"] = time.monotonic()
    except Exception as exc:  # noqa: BLE001 - the frontend raises it at start-up
        outputs.send(LoadFailed(str(exc)))
        return
    threads = serving_threads(config, loaded)
    if threads:
        torch.set_num_threads(threads)
    log.info("torch threads: %d", torch.get_num_threads())
    core = EngineCore(loaded, config)
    gc.collect()
    gc.freeze()  # the model's and tokenizer's objects live as long as this process: the step loop's collections skip them
    stages["ready"] = time.monotonic()
    outputs.send(Ready(loaded.info, None if sent else loaded.tokenizer, core.stats(), stages))
    CoreLoop(core, commands, outputs).run()


def set_up_process() -> None:
    """What every engine process sets first, however it was started."""
    # Ctrl+C reaches the whole process group; the frontend decides when this process ends
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the frontend's watchdog asks, at a stall
    logging.basicConfig(level=logging.INFO, format="engine-process %(levelname)s %(name)s: %(message)s")


def run(commands: Connection, outputs: Connection) -> None:
    """Serve the executor at the other end of these until it goes (EOF) or says to stop."""
    try:
        serve(commands, outputs)
    except (EOFError, OSError):
        pass


def main() -> None:
    set_up_process()
    run(Connection(int(sys.argv[1]), writable=False), Connection(int(sys.argv[2]), readable=False))


if __name__ == "__main__":
    main()
