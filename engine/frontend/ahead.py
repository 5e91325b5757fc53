"""The engine process that the launcher starts ahead (core/ahead_process.py): started, and claimed.

`start_ahead` is the launcher's (deploy/jina_cli.py): as its first act, before it imports Jina,
it starts the process and names its socket in LLM_ENGINE_AHEAD, which the Flow's processes
inherit. `claim_ahead` is an executor's (executors/early_engine.py): it connects, and the process
is its engine process if it answers `Claimed`; else (none started, `off`, another executor was
first, it gave up waiting) the executor starts one of its own, as before.

A claimed process is not the executor's child but the launcher's, which reaps it. The executor
waits for it and signals it through a pidfd (`ClaimedProcess`), which stays bound to that process
whatever happens to its pid; its exit code is the launcher's to read, so the executor's messages
say the process exited without one.
"""
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import uuid
from multiprocessing.connection import Connection
from typing import Optional

from contract import settings

from ..core.ahead_process import peer
from ..messages import Claimed
from .spare import CoreProcess, engine_env

AHEAD = "LLM_ENGINE_AHEAD"
OFF = "off"
EXIT_UNKNOWN = -(1 << 16)  # a claimed process's exit code: never a real one (Popen's are -64 to 255)
ANSWER_S = 5.0  # a claimed process answers from its accepting thread, within milliseconds


def start_ahead() -> Optional[subprocess.Popen]:
    """Start the engine process ahead and name it in this process's environment, for the processes
    it starts; None when LLM_ENGINE_AHEAD is `off` or names one already."""
    if settings.read(AHEAD) is not None:
        return None
    name = f"llm-engine-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    process = subprocess.Popen([sys.executable, "-m", "engine.core.ahead_process", name], env=engine_env())
    os.environ[AHEAD] = name
    threading.Thread(target=process.wait, name="llm-engine-ahead-reaper", daemon=True).start()
    return process


class ClaimedProcess:
    """subprocess.Popen's part that EngineProcess and SpareCore use, for a process this one did not
    start: once it has exited, its code is EXIT_UNKNOWN (the code is its parent's to read)."""

    def __init__(self, pid: int):
        self.pid = pid
        self._fd = os.pidfd_open(pid)
        self.returncode: Optional[int] = None

    def poll(self) -> Optional[int]:
        return self._ended(0)

    def wait(self, timeout: Optional[float] = None) -> int:
        code = self._ended(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(f"engine process {self.pid}", timeout or 0.0)
        return code

    def kill(self) -> None:
        try:
            signal.pidfd_send_signal(self._fd, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def _ended(self, timeout: Optional[float]) -> Optional[int]:
        if self.returncode is None and select.select([self._fd], [], [], timeout)[0]:
            self.returncode = EXIT_UNKNOWN
        return self.returncode

    def __del__(self) -> None:
        if hasattr(self, "_fd"):  # pidfd_open may have failed (the process gone already)
            os.close(self._fd)


def claim_ahead() -> Optional[CoreProcess]:
    """The engine process started ahead, now this executor's; None when there is none to claim."""
    name = settings.read(AHEAD)
    if not name or name == OFF:
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(ANSWER_S)
        sock.connect("\0" + name)
        pid, uid = peer(sock)
        if uid != os.getuid():  # not ours: nothing of it is unpickled
            return None
        sock.setblocking(True)
        outputs = Connection(os.dup(sock.fileno()), writable=False)
        if not outputs.poll(ANSWER_S):
            outputs.close()
            return None
        answer = outputs.recv()
        if not isinstance(answer, Claimed) or answer.pid != pid:
            outputs.close()
            return None
        commands = Connection(os.dup(sock.fileno()), readable=False)
        return CoreProcess(ClaimedProcess(pid), commands, outputs, answer.started_at)
    except (OSError, EOFError):  # none listens (any more), or it refused: another executor was first
        return None
    finally:
        sock.close()


