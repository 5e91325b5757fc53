"""Engine processes, and one started ahead of the next load (a spare).

An engine process spends about 3 s importing torch, transformers and the engine before it reads its
LoadModel (core_process.py), and about 1 s loading a small model after. A model that its
keep-alive unloaded would make its next request wait for both. So when a model unloads, a spare
engine process starts: it does its imports and waits, blocked on its pipe, for the config of the
next load, which takes it and waits for the model alone.

The spare costs the memory of those imports (392 MiB resident, 321 MiB PSS, measured on
2026-12-06; much of it torch's and transformers' code, shared with the page cache) while the model
is unloaded, against the model's weights and KV cache it replaces; none while the model is loaded. It is never left behind: `close`
kills it (the service stops), and, should the service's process die first, its pipe reads EOF and it
exits, as a serving engine process does.
"""
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from .ahead import ClaimedProcess

_ROOT = str(Path(__file__).resolve().parents[2])  # holds the `engine` package


@dataclass
class CoreProcess:
    """An engine process and its two pipes, before it has its config."""

    process: "subprocess.Popen | ClaimedProcess"  # ahead.py's: one that the launcher started
    commands: Connection  # ours to write
    outputs: Connection  # ours to read
    spawned_at: float  # time.monotonic()
    spare: bool = False  # started ahead of its load
    first: bool = False  # started ahead of the first load, with the executor (not by an unload)

    def discard(self) -> None:
        """It goes: its pipes closed, the process killed and reaped."""
        self.commands.close()
        self.outputs.close()
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


def engine_env() -> dict[str, str]:
    """An engine process's environment: this one's, with the `engine` package importable."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [_ROOT, os.environ.get("PYTHONPATH")]))}


def spawn_core() -> CoreProcess:
    """Start an engine process (milliseconds): it imports, then waits for its LoadModel."""
    cmd_read, cmd_write = os.pipe()
    out_read, out_write = os.pipe()
    env = engine_env()
    spawned_at = time.monotonic()
    try:
        process = subprocess.Popen([sys.executable, "-m", "engine.core.core_process", str(cmd_read), str(out_write)],
                                   pass_fds=(cmd_read, out_write), env=env)
    except BaseException:
        for fd in (cmd_read, cmd_write, out_read, out_write):
            os.close(fd)
        raise
    os.close(cmd_read)
    os.close(out_write)
    return CoreProcess(process, Connection(cmd_write, readable=False), Connection(out_read, writable=False),
                       spawned_at)


class SpareCore:
    """At most one engine process started ahead, for the next load to take. Thread-safe: the
    lifecycle fills it on a thread after an unload, a load takes it on another, the service's stop
    closes it from any."""

    def __init__(self, ahead: Optional[CoreProcess] = None) -> None:
        """ahead: an engine process already started for the first load (the executor's, started as
        Jina loaded its modules: executors/early_engine.py)."""
        self._core = ahead
        if ahead is not None:
            ahead.spare = ahead.first = True
        self._closed = False
        self._lock = threading.Lock()
        self.started = self.taken = 0

    def fill(self) -> None:
        """Start the spare, unless one waits (or the service stops)."""
        with self._lock:
            if self._closed or (self._core is not None and self._core.process.poll() is None):
                return
            if self._core is not None:  # it died while it waited: gone with its pipes
                self._core.discard()
            self._core = spawn_core()
            self._core.spare = True
            self.started += 1

    def take(self) -> Optional[CoreProcess]:
        """The spare, for a load (its imports done, or under way); None when there is none alive."""
        with self._lock:
            core, self._core = self._core, None
        if core is not None and core.process.poll() is not None:
            core.discard()
            return None
        if core is not None and not core.first:  # `taken` counts the spares that unloads started
            self.taken += 1
        return core

    @property
    def pid(self) -> Optional[int]:
        """The waiting spare's process id, if one waits."""
        core = self._core
        return core.process.pid if core is not None else None

    def close(self) -> None:
        """The service stops: no spare from now on, and the waiting one goes."""
        with self._lock:
            self._closed = True
            core, self._core = self._core, None
        if core is not None:
            core.discard()
