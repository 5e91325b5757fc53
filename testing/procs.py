"""Server subprocesses in their own process group, always torn down with everything they spawned."""
import asyncio
import atexit
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Optional

import psutil

ROOT = Path(__file__).resolve().parent.parent
_LIVE: set["ServerProcess"] = set()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def service_processes(mark: str) -> list[psutil.Process]:
    """Every live process started with LLM_TEST_MARK=mark in its environment: a service and all it
    started, wherever they went (a process that left the group is found too)."""
    found = []
    for process in psutil.process_iter():
        try:
            if process.environ().get("LLM_TEST_MARK") == mark and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return found


class ServerProcess:
    """`cmd` started with start_new_session=True; stop() signals the whole group."""

    def __init__(self, cmd: list[str], log_path: Path, env: Optional[dict] = None):
        self.cmd = cmd
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=self._log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        self.public_ports: set[int] = set()  # a Flow's: its gateway listens on them (cpu_seconds)
        _LIVE.add(self)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGINT to the group, then SIGKILL to whatever is left of it."""
        if self not in _LIVE:
            return
        _LIVE.discard(self)
        if self.proc.poll() is None:
            _killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        _killpg(self.proc.pid, signal.SIGKILL)  # children that outlived the parent
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            pass
        self._log.close()

    def tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def wait_port(self, port: int, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return
            time.sleep(0.3)
        raise TimeoutError(f"port {port} not open after {timeout:.0f}s:\n{self.tail()}")

    def wait_http(self, url: str, timeout: float = 180.0, success_only: bool = False) -> None:
        """Until `url` answers (any HTTP status counts: the server is up; with `success_only`, only
        a 2xx does, as a health check that answers 503 while the model loads)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                with urllib.request.urlopen(url, timeout=5):
                    return
            except urllib.error.HTTPError:
                if not success_only:
                    return
                time.sleep(0.3)
            except OSError:
                time.sleep(0.3)
        raise TimeoutError(f"{url} not answering after {timeout:.0f}s:\n{self.tail()}")

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.cmd[0]} exited with code {self.proc.returncode}:\n{self.tail()}")


def cpu_seconds() -> dict[str, float]:
    """CPU time (user + system) used so far, by role: this process (`client`) and each live
    server's processes: `engine` (the engine process), `gateway` (listens on a public port),
    `executor` (the Flow's other children) or `server` (a server's own process)."""
    totals = {"client": _cpu(psutil.Process())}
    for server in list(_LIVE):
        try:
            root = psutil.Process(server.proc.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
        for proc in procs:
            role = _role(proc, root, server.public_ports)
            totals[role] = totals.get(role, 0.0) + _cpu(proc)
    return totals


async def settle(quiet: float = 0.05, window: float = 0.5, limit: float = 10.0) -> float:
    """Waits (at most `limit` s) until the live servers use under `quiet` of a core over
    `window` s; returns the seconds waited. A Flow goes on printing and importing for about a
    second after it first answers (80 ms of CPU, measured), and on 2 cores that work landed in
    the first level measured, gRPC at C=1, which lasts under half a second in --quick."""
    start = time.monotonic()
    before = _servers_cpu()
    while time.monotonic() - start < limit:
        await asyncio.sleep(window)
        after = _servers_cpu()
        if after - before < quiet * window:
            break
        before = after
    return time.monotonic() - start


def _servers_cpu() -> float:
    return sum(seconds for role, seconds in cpu_seconds().items() if role != "client")


def _role(proc: psutil.Process, root: psutil.Process, public_ports: set[int]) -> str:
    try:
        if "engine.core.core_process" in " ".join(proc.cmdline()):
            return "engine"
        if proc.pid == root.pid:
            return "server"
        listening = {c.laddr.port for c in proc.net_connections("tcp") if c.status == psutil.CONN_LISTEN}
        return "gateway" if listening & public_ports else "executor"
    except psutil.Error:
        return "gone"


def _cpu(proc: psutil.Process) -> float:
    try:
        times = proc.cpu_times()
        return times.user + times.system
    except psutil.Error:
        return 0.0


def _killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_all() -> None:
    """Last resort (atexit, signals): no server outlives the benchmark."""
    for server in list(_LIVE):
        server.stop(timeout=5)


atexit.register(stop_all)
