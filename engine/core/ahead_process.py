"""An engine process that the launcher starts before its own imports, for an executor to claim.

`make serve` starts Jina through deploy/jina_cli.py, which imports Jina for 1.7 s before the Flow
forks its executors; an executor then started its engine process as Jina loaded its module
(executors/early_engine.py), and that process's imports (torch, transformers and the engine:
about 4.5 s) came after both. Started here as the launcher's first act, they run beside the
launcher's imports instead, and the executor claims a process whose imports are mostly done.

    python -m engine.core.ahead_process NAME

It listens on NAME, a Unix socket of the abstract namespace that the launcher hands its children
in LLM_ENGINE_AHEAD, from its first milliseconds, and a thread accepts while the imports run. The
first process of this user (SO_PEERCRED) that connects claims it: it answers `Claimed` at once,
stops listening, and from then on serves that executor as an engine process that the executor
started would (core_process.py: LoadModel first, then the steps), over the socket. A
connection that comes after is refused, and its executor starts an engine process of its own,
as does every executor when there is none to claim. Unclaimed after CLAIM_WAIT_S (a Flow with no
generating executor, or whose engine runs in the executor's process), it exits. It dies with the
launcher (PR_SET_PDEATHSIG) and, once claimed, when the executor's end of the socket closes.
"""
import gc
import os
import signal
import socket
import struct
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import Optional

from contract.lifecycle import die_with_parent

from ..messages import Claimed

STARTED = time.monotonic()
CLAIM_WAIT_S = 60.0  # a Flow's executors load their modules within seconds of its start
_CREDENTIALS = struct.Struct("3i")  # SO_PEERCRED: pid, uid, gid


def peer(sock: socket.socket) -> tuple[int, int]:
    """The (pid, uid) of the process at the other end of a connected Unix socket."""
    pid, uid, _ = _CREDENTIALS.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CREDENTIALS.size))
    return pid, uid


def listen(name: str) -> socket.socket:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind("\0" + name)
    listener.listen(8)
    return listener


def claim_first(listener: socket.socket, wait_s: float) -> Optional[socket.socket]:
    """The first connection from a process of this user, answered `Claimed`; the listener is
    closed then (the connections behind it are refused). None when none comes within wait_s."""
    deadline = time.monotonic() + wait_s
    try:
        while (left := deadline - time.monotonic()) > 0:
            listener.settimeout(left)
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                return None
            if peer(conn)[1] != os.getuid():  # another user's: never its commands, never our answers
                conn.close()
                continue
            conn.setblocking(True)
            answer = Connection(os.dup(conn.fileno()), readable=False)
            answer.send(Claimed(os.getpid(), STARTED))
            answer.close()
            return conn
        return None
    finally:
        listener.close()


def main() -> None:
    gc.disable()  # while it imports, as core_process's main (its prewarm turns it on again)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl+C reaches the launcher's group: it decides
    die_with_parent()
    listener = listen(sys.argv[1])
    claimed: list[Optional[socket.socket]] = []
    accepting = threading.Thread(target=lambda: claimed.append(claim_first(listener, CLAIM_WAIT_S)),
                                 name="llm-engine-claim", daemon=True)
    accepting.start()
    from .core_process import run, set_up_process  # the imports: seconds, while the thread accepts
    set_up_process()
    accepting.join()
    conn = claimed[0] if claimed else None
    if conn is None:
        return
    fd = conn.detach()
    run(Connection(fd, writable=False), Connection(os.dup(fd), readable=False))


if __name__ == "__main__":
    main()
