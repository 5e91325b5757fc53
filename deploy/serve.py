"""`make serve`: `jina flow --uses FLOW`, stopped whole whenever it is stopped.

The Flow runs in a process group of its own. SIGINT or SIGTERM (Ctrl-C, `kill`, a container's
stop) reaches every process of it: the Flow closes its gateway and executors, and whatever is left
after a grace period (a Flow stopped while it starts can hang in Jina's start) is killed. Its
processes also die with their parent (contract/lifecycle.py), so none outlives the service.

A Flow that cannot start (a model that does not load) is stopped the same way, and this exits 1:
Jina says "Flow is aborted" and then waits forever for its gateway, which waits for the executors
that failed. A supervisor or a container runtime learns of the failure from the exit status.
The Flow's output passes through this process, which watches it for that line.

The variables that change the Flow's shape (LLM_GRPC_PORT, LLM_HTTP_PORT, LLM_REPLICAS, and
LLM_MODELS=a,b for one generating deployment per model) are applied to a copy of it (flow_models.py).

    python deploy/serve.py flows/llm.yml [--grace SECONDS]
"""
import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO

from flow_models import models_from_env, write_flow
from jina_cli import command as jina_command

ABORTED = b"Flow is aborted"  # Jina's line when a deployment of the Flow cannot start
ANSI = re.compile(rb"\x1b\[[0-9;]*m")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("flow")
    parser.add_argument("--grace", type=float, default=float(os.environ.get("LLM_STOP_GRACE_S", "20")))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="llm-flow-") as scratch:  # the Flow the variables make, if any
        try:
            flow_file = write_flow(args.flow, models_from_env(), Path(scratch) / "flow.yml")
        except ValueError as exc:
            print(f"serve: {exc}", file=sys.stderr)
            return 2
        return run(jina_command(), flow_file, args.grace)


def run(jina: list[str], flow_file: str, grace: float) -> int:
    """The Flow from start to stop (see the module docstring): its exit status."""
    env = dict(os.environ)
    if sys.stdout.isatty():  # Jina's console as in a terminal, though its output comes through a pipe
        env.setdefault("FORCE_COLOR", "1")
        env.setdefault("COLUMNS", str(shutil.get_terminal_size().columns))
    flow = subprocess.Popen([*jina, "flow", "--uses", flow_file], start_new_session=True, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    aborted = threading.Event()
    assert flow.stdout is not None
    threading.Thread(target=_pass_through, args=(flow.stdout, aborted), daemon=True).start()
    stopping: list[int] = []

    def stop(signum: int, _frame: object) -> None:
        if not stopping:
            stopping.append(signum)
            _signal_group(flow.pid, signal.SIGTERM)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    while flow.poll() is None and not stopping and not aborted.is_set():
        time.sleep(0.2)
    if aborted.is_set() and not stopping:
        print("serve: the Flow could not start (the error is above); stopping it", file=sys.stderr, flush=True)
        _signal_group(flow.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while flow.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    _signal_group(flow.pid, signal.SIGKILL)  # the Flow's processes that outlived it, or it
    flow.wait()
    if aborted.is_set() and not stopping:
        return 1
    return 0 if stopping else flow.returncode


def _pass_through(output: IO[bytes], aborted: threading.Event) -> None:
    """The Flow's output, line by line, to ours; `aborted` set at Jina's abort line."""
    for line in iter(output.readline, b""):
        try:
            sys.stdout.buffer.write(line)
            sys.stdout.buffer.flush()
        except OSError:  # our reader went away: keep draining, so that the Flow never blocks on a full pipe
            pass
        if ABORTED in ANSI.sub(b"", line):
            aborted.set()


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


if __name__ == "__main__":
    sys.exit(main())
