"""python -m benchmarks reload: the first token after a keep-alive unload.

`make serve`'s Flow on one model (the default one unless `--model`); each round, a request with
`keep_alive: 0` unloads it, the model's state is waited for (`/v1/models` says `unloaded`), then
`--settle` seconds for the spare engine process's imports (docs/operations.md), and the next
streamed completion's first token is timed from its request. Prints each round and the median.
"""
import argparse
import json
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Optional

from testing.flows import start_flow

from .. import HERE

PROG = "python -m benchmarks reload"


def _post(port: int, body: dict) -> Any:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    return urllib.request.urlopen(request, timeout=300)


def _unloaded(port: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=30) as answer:
            if json.load(answer)["data"][0].get("state") == "unloaded":
                return
        time.sleep(0.2)
    raise TimeoutError("the model did not unload")


def first_token_after_unload(port: int, settle: float) -> float:
    """One round: unload, wait, and the next streamed completion's first token (seconds)."""
    _post(port, {"prompt": "Hi", "max_tokens": 2, "keep_alive": 0}).read()
    _unloaded(port)
    time.sleep(settle)
    started = time.perf_counter()
    with _post(port, {"prompt": "The capital of France is", "max_tokens": 8, "stream": True,
                      "temperature": 0}) as answer:
        for line in answer:
            if line.startswith(b"data: {"):
                break
    return time.perf_counter() - started


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--model", default=str(HERE.parent / "models" / "SmolLM2-135M-Instruct"))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--settle", type=float, default=15.0, help="seconds between the unload and the request")
    args = p.parse_args(argv)
    server, _, http_port = start_flow(str(Path(args.model).resolve()), Path(tempfile.mkdtemp(prefix="reload-")))
    try:
        times = []
        for round_ in range(args.rounds):
            times.append(first_token_after_unload(http_port, args.settle))
            print(f"round {round_ + 1}: first token {times[-1]:.2f} s after the request", flush=True)
    finally:
        server.stop()
    print(f"{Path(args.model).name}: median {statistics.median(times):.2f} s over {len(times)} rounds "
          f"({min(times):.2f} to {max(times):.2f} s)")
    return 0
