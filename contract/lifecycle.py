"""How every process of the service ends with the one that started it.

A Flow's gateway and executors are processes that `jina flow` forks. Stopped during its start, the
Flow's main process could exit while a child was still starting (an executor loading its model,
the gateway asking executors that had gone for their endpoints): Jina's signal handler in that
child only sets a flag that its start never reads, so it lived on, reparented to init. Each of our
processes therefore asks the kernel to kill it when its parent dies (Linux's PR_SET_PDEATHSIG);
the engine process, in turn, exits when its pipe to the executor closes.
"""
import ctypes
import ctypes.util
import multiprocessing
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """From now on, this process is killed when its parent exits (Linux; elsewhere a no-op). A
    process that multiprocessing started (a Flow's) and whose parent has already gone ends now."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    parent = multiprocessing.parent_process()
    if parent is not None and parent.pid != os.getppid():  # it died before the request took effect
        os.kill(os.getpid(), signal.SIGKILL)
