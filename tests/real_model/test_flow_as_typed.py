"""`jina flow --uses flows/llm.yml` exactly as typed, in an empty environment: it serves the default
model on 12345 and 12346, and Ctrl-C (SIGINT to its group, as a terminal sends it) stops every
process. Without the default model and without LLM_MODEL it says so, naming LLM_MODEL, and exits,
leaving no process. Each step's time is printed (`pytest -s`), as the start's cost is what users wait."""
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest
import requests

from testing.procs import ROOT, service_processes

PORTS = (12345, 12346)  # flows/llm.yml's
JINA = str(Path(sys.executable).parent / "jina")


def bare_environment(mark: str) -> dict[str, str]:
    """What a fresh login shell has, and the mark that finds the processes (testing.procs)."""
    return {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"), "LLM_TEST_MARK": mark}


def typed(cwd: Path, log: Path, mark: str) -> subprocess.Popen:
    return subprocess.Popen([JINA, "flow", "--uses", "flows/llm.yml"], cwd=cwd, env=bare_environment(mark),
                            stdin=subprocess.DEVNULL, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def leftovers(mark: str, within: float) -> list[str]:
    """The service's processes still alive `within` seconds from now (then killed)."""
    deadline = time.monotonic() + within
    while (left := service_processes(mark)) and time.monotonic() < deadline:
        time.sleep(0.25)
    described = [describe(process) for process in left]
    for process in left:
        process.kill()
    return described


def describe(process: psutil.Process) -> str:
    try:
        return f"{process.pid} {process.status()} {' '.join(process.cmdline())[:80]}"
    except psutil.Error as exc:
        return f"{process.pid} {type(exc).__name__}"


def busy(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_jina_flow_as_typed_serves_the_default_model_and_stops_on_ctrl_c(real_model, tmp_path):
    if os.path.realpath(real_model) != os.path.realpath(ROOT / "models" / "SmolLM2-135M-Instruct"):
        pytest.skip("the default model is not where flows/llm.yml looks for it")
    assert not any(busy(p) for p in PORTS), f"ports {PORTS} are taken: stop the service on them to run this test"
    mark, started = uuid.uuid4().hex, time.monotonic()
    flow = typed(ROOT, tmp_path / "flow.log", mark)
    try:
        answer = None
        while answer is None and time.monotonic() - started < 180:
            assert flow.poll() is None, (tmp_path / "flow.log").read_text()[-3000:]
            try:
                answer = requests.post(f"http://127.0.0.1:{PORTS[1]}/v1/chat/completions", timeout=60, json={
                    "messages": [{"role": "user", "content": "What is the capital of France?"}],
                    "max_tokens": 16, "temperature": 0}).json()
            except requests.ConnectionError:
                time.sleep(0.5)
        print(f"\njina flow as typed: first answer {time.monotonic() - started:.1f} s after the start")
        assert answer is not None, "no answer within 180 s"
        assert answer["model"] == "SmolLM2-135M-Instruct"
        assert "Paris" in answer["choices"][0]["message"]["content"]
        assert busy(PORTS[0])  # gRPC too
        stopping = time.monotonic()
        os.killpg(flow.pid, signal.SIGINT)
        assert leftovers(mark, 60) == []
        print(f"jina flow as typed: every process gone {time.monotonic() - stopping:.1f} s after Ctrl-C")
    finally:
        if flow.poll() is None:
            os.killpg(flow.pid, signal.SIGKILL)
        flow.wait(10)


def test_jina_flow_as_typed_without_a_model_names_llm_model_and_exits(tmp_path):
    """A checkout where `make model` has not run: the Flow's files, no models/."""
    for name in ("flows", "jina.yml", "gateway", "executors"):
        (tmp_path / name).symlink_to(ROOT / name)
    mark, started = uuid.uuid4().hex, time.monotonic()
    flow = typed(tmp_path, tmp_path / "flow.log", mark)
    try:
        flow.wait(150)
    finally:
        if flow.poll() is None:
            os.killpg(flow.pid, signal.SIGKILL)
    print(f"\njina flow without a model: exited {flow.returncode} after {time.monotonic() - started:.1f} s")
    log = (tmp_path / "flow.log").read_text(errors="replace")
    assert flow.returncode != 0
    assert "LLM_MODEL is not set" in " ".join(log.split()), log[-3000:]
    assert leftovers(mark, 10) == []
