"""`make serve`: `jina flow --uses FLOW`, stopped whole whenever it is stopped.

The Flow runs in a process group of its own. SIGINT or SIGTERM (Ctrl-C, `kill`, a container's
stop) reaches every process of it: the Flow closes its gateway and executors, and whatever is left
after a grace period (a Flow stopped while it starts can hang in Jina's start) is killed. Its
processes also die with their parent (contract/lifecycle.py), so none outlives the service.

    python deploy/serve.py flows/llm.yml [--grace SECONDS]
"""
import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("flow")
    parser.add_argument("--grace", type=float, default=float(os.environ.get("LLM_STOP_GRACE_S", "20")))
    args = parser.parse_args()
    jina = str(Path(sys.executable).parent / "jina")
    flow = subprocess.Popen([jina, "flow", "--uses", args.flow], start_new_session=True)
    stopping: list[int] = []

    def stop(signum: int, _frame: object) -> None:
        if not stopping:
            stopping.append(signum)
            _signal_group(flow.pid, signal.SIGTERM)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    while flow.poll() is None and not stopping:
        time.sleep(0.2)
    deadline = time.monotonic() + args.grace
    while flow.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    _signal_group(flow.pid, signal.SIGKILL)  # the Flow's processes that outlived it, or it
    flow.wait()
    return 0 if stopping else flow.returncode


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


if __name__ == "__main__":
    sys.exit(main())
