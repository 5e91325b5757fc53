"""Stopping the service at any moment, its start included, leaves no process behind: `make serve`
(deploy/serve.py) on Ctrl-C or SIGTERM, and a bare `jina flow` whose processes die with it
(contract/lifecycle.py)."""
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from testing.procs import ROOT, free_port, service_processes


def start(model: str, tmp: Path, bare: bool) -> tuple[subprocess.Popen, str, int]:
    mark, http_port = uuid.uuid4().hex, free_port()
    env = {**os.environ, "LLM_MODEL": model, "LLM_REPLICAS": "2", "LLM_GRPC_PORT": str(free_port()),
           "LLM_HTTP_PORT": str(http_port), "LLM_TEST_MARK": mark}
    jina = str(Path(sys.executable).parent / "jina")
    if bare:  # the ports and replicas written into the Flow file, as `make serve` writes them
        from deploy.flow_models import write_flow
        cmd = [jina, "flow", "--uses", write_flow(str(ROOT / "flows/llm.yml"), [], tmp / "flow.yml", env)]
    else:
        cmd = [sys.executable, "deploy/serve.py", "flows/llm.yml"]
    log = open(tmp / f"{mark}.log", "wb")
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True), mark, http_port


def stop_and_count(process: subprocess.Popen, mark: str, sig: signal.Signals, group: bool) -> list[str]:
    """Signal the service; what of it is still running 20 s later (then killed)."""
    os.killpg(process.pid, sig) if group else process.send_signal(sig)
    deadline = time.monotonic() + 20
    while (left := service_processes(mark)) and time.monotonic() < deadline:
        time.sleep(0.25)
    for leftover in left:
        leftover.kill()
    process.wait(10)
    return [" ".join(p.cmdline())[:80] for p in left]


@pytest.mark.parametrize("moment,sig,group", [
    (1.0, signal.SIGTERM, True), (3.0, signal.SIGINT, True), (6.0, signal.SIGTERM, False)],
    ids=["1s-group-term", "3s-group-int", "6s-term"])
def test_make_serve_stopped_at_any_moment_leaves_no_process(gpt2_model, tmp_path, moment, sig, group):
    """While it starts; a ready service's Ctrl-C is checked by test_readme_commands.py, for each
    `make serve` the README shows."""
    process, mark, _ = start(gpt2_model, tmp_path, bare=False)
    time.sleep(moment)
    assert stop_and_count(process, mark, sig, group) == []


def test_a_bare_flow_stopped_while_it_starts_leaves_no_process(gpt2_model, tmp_path):
    """SIGTERM to the group of `jina flow` while its replicas start: Jina's main process exits
    with children still starting, which die with it."""
    process, mark, _ = start(gpt2_model, tmp_path, bare=True)
    time.sleep(4.0)
    assert stop_and_count(process, mark, signal.SIGTERM, True) == []


def test_make_serve_with_a_model_that_cannot_load_exits_non_zero_leaving_no_process(tmp_path):
    """Jina aborts the Flow and then waits forever for its gateway: deploy/serve.py sees the abort,
    stops the Flow and exits 1, so that a supervisor or a container runtime learns of it."""
    process, mark, _ = start(str(tmp_path / "no-such-model"), tmp_path, bare=False)
    try:
        assert process.wait(120) == 1
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while (left := service_processes(mark)) and time.monotonic() < deadline:
        time.sleep(0.25)
    assert [" ".join(p.cmdline())[:80] for p in left] == []
    log = (tmp_path / f"{mark}.log").read_text()
    assert "could not load model" in log and "the Flow could not start" in log
