"""The engine process: EngineCore's step loop, fed and drained through two pipes.

Run as `python -m executors.engine.core_process CMD_FD OUT_FD` by EngineProcess, which
sends the EngineConfig first. It answers with ("ready", ModelInfo, tokenizer, stats) or
("failed", message), then, after every step or batch of commands, with one message:
(acks, token outputs, observer events, stats). Commands are ("add", request_id,
Prepared), ("abort", request_id) and ("stop",). When the other end goes away (even killed
with SIGKILL), the pipe reads EOF and this process exits: none is left behind.
"""
import logging
import os
import signal
import sys
from multiprocessing.connection import Connection
from typing import Any, Optional

import torch

from .core import EngineCore
from .errors import EngineDeadError, OverloadedError, ValidationError
from .loader import LoadedModel, load_model
from .observer import EngineObserver
from .params import EngineConfig, FinishReason
from .request import TokenOutput

log = logging.getLogger(__name__)


class Recorder(EngineObserver):
    """Keeps the observer calls, to be replayed on the frontend's observer (metrics)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, tuple]] = []

    def admitted(self, queued_seconds: float) -> None:
        self.events.append(("admitted", (queued_seconds,)))

    def prefilled(self, prompt_tokens: int) -> None:
        self.events.append(("prefilled", (prompt_tokens,)))

    def token(self, first: bool, since_previous_seconds: float) -> None:
        self.events.append(("token", (first, since_previous_seconds)))

    def finished(self, reason: Optional[FinishReason], e2e_seconds: float) -> None:
        self.events.append(("finished", (reason, e2e_seconds)))


class CoreLoop:
    def __init__(self, core: EngineCore, commands: Connection, outputs: Connection):
        self.core, self.commands, self.outputs = core, commands, outputs
        self.recorder = Recorder()
        core.observer = self.recorder
        self.acks: list[tuple[str, Optional[BaseException]]] = []
        self.tokens: list[TokenOutput] = []

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
        while self.commands.poll(None if block else 0):
            block = False
            command = self.commands.recv()
            if command[0] == "add":
                self._add(*command[1:])
            elif command[0] == "abort":
                self.core.abort(command[1])
            elif command[0] == "stop":
                self.core.fail_all("the engine is shutting down", close=True)
                self._flush()
                return False
        return True

    def _add(self, request_id: str, prepared: Any) -> None:
        try:
            self.core.add(request_id, prepared, self._emit)
            self.acks.append((request_id, None))
        except (ValidationError, OverloadedError, EngineDeadError) as exc:  # these pickle
            self.acks.append((request_id, exc))
        except Exception as exc:  # noqa: BLE001 - refused: the frontend raises it for this request
            log.exception("request %s could not be queued", request_id)
            self.acks.append((request_id, RuntimeError(f"{type(exc).__name__}: {exc}")))

    def _emit(self, out: TokenOutput) -> None:
        self.tokens.append(out)

    def _flush(self) -> None:
        self.outputs.send((self.acks, self.tokens, self.recorder.events, self.core.stats()))
        self.acks, self.tokens, self.recorder.events = [], [], []


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


def serve(commands: Connection, outputs: Connection) -> None:
    config = commands.recv()
    try:
        loaded = load_model(config)
    except Exception as exc:  # noqa: BLE001 - the frontend raises it at start-up
        outputs.send(("failed", str(exc)))
        return
    threads = serving_threads(config, loaded)
    if threads:
        torch.set_num_threads(threads)
    log.info("torch threads: %d", torch.get_num_threads())
    core = EngineCore(loaded, config)
    outputs.send(("ready", loaded.info, loaded.tokenizer, core.stats()))
    CoreLoop(core, commands, outputs).run()


def main() -> None:
    # Ctrl+C reaches the whole process group; the frontend decides when this process ends
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format="engine-process %(levelname)s %(name)s: %(message)s")
    commands = Connection(int(sys.argv[1]), writable=False)
    outputs = Connection(int(sys.argv[2]), readable=False)
    try:
        serve(commands, outputs)
    except (EOFError, OSError):
        pass


if __name__ == "__main__":
    main()
