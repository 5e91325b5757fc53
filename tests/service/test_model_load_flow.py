"""A model unloaded by its keep-alive, in a real Flow: the next request takes the spare engine process
that the unload started, waits for the model's load alone and gets its tokens; the service reports
the wait (the metric llm:model_load_wait_seconds, /api/ps's load_duration) and the load's stages
(llm:model_load_stage_seconds, /stats, the log); a load that fails answers its request with an error
naming the model while the service serves on; and the service stopped while the spare waits leaves no
process. Speed is not asserted (a shared 2-core machine): the first token's time is printed."""
import json
import os
import shutil
import signal
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from testing.procs import service_processes

NAME = "gpt2"  # the served name of the model's folder
# past every time limit a request meets on its way: unary calls' 10 and 15 s (the executors no longer
# drop a channel idle for 30 s: gateway/fleet/channels.py's PING_POLICY)
LONG_LOAD_S = 20


@pytest.fixture(scope="module")
def flow(gpt2_model, tmp_path_factory):
    """(http_port, the model's folder, the ServerProcess, its LLM_TEST_MARK): a Flow serving a copy of
    the tiny gpt2, which a test may take away while it is unloaded."""
    from testing.flows import start_flow
    tmp = tmp_path_factory.mktemp("load")
    folder = tmp / NAME
    shutil.copytree(gpt2_model, folder)
    mark = uuid.uuid4().hex
    server, _, http_port = start_flow(str(folder), tmp, env={"LLM_TEST_MARK": mark})
    yield http_port, folder, server, mark
    server.stop()


def _generate(http_port: int, **body) -> requests.Response:
    return requests.post(f"http://127.0.0.1:{http_port}/api/generate", timeout=300, json={
        "model": NAME, "prompt": "hello", "raw": True, "stream": False, "options": {"temperature": 0, "num_predict": 6},
        **body})


def _unload(http_port: int) -> None:
    """Keep-alive 0, then until /api/ps no longer lists the model."""
    assert _generate(http_port, keep_alive=0).status_code == 200
    for _ in range(300):
        if not requests.get(f"http://127.0.0.1:{http_port}/api/ps", timeout=30).json()["models"]:
            return
        time.sleep(0.1)
    raise AssertionError("the model did not unload")


def _replica_stats(http_port: int) -> dict:
    return requests.get(f"http://127.0.0.1:{http_port}/stats", timeout=30).json()["replicas"][0]


def _first_token_s(http_port: int) -> tuple[float, str]:
    """A streamed /api/generate: seconds to its first line with text, and its whole text."""
    started, first, text = time.monotonic(), None, ""
    with requests.post(f"http://127.0.0.1:{http_port}/api/generate", stream=True, timeout=300, json={
            "model": NAME, "prompt": "hello", "raw": True, "options": {"temperature": 0, "num_predict": 6}}) as r:
        assert r.status_code == 200, r.text
        for line in r.iter_lines():
            chunk = json.loads(line)
            assert "error" not in chunk, chunk
            if chunk.get("response") and first is None:
                first = time.monotonic() - started
            text += chunk.get("response", "")
    assert first is not None
    return first, text


def _samples(metrics: str, name: str) -> dict[str, float]:
    """A metric's samples whose name starts with `name`: {the line's name and labels: value}."""
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
            if line.startswith(name)}


def test_the_next_request_after_an_unload_takes_the_spare_and_the_wait_is_reported(flow):
    http_port, _, server, _ = flow
    first_load = _replica_stats(http_port)
    # the Flow's first load took the engine process that the launcher started before its own imports,
    # claimed as Jina loaded the executor's modules (executors/early_engine.py): its imports ran beside
    # Jina's and the executor's
    assert first_load["model_load_stages"]["spare"] == 1.0 and first_load["spare"]["taken"] == 0
    answer = _generate(http_port).json()["response"]
    _unload(http_port)
    spare = _replica_stats(http_port)["spare"]
    assert spare["pid"] is not None and spare["taken"] == 0
    time.sleep(8)  # its imports done (seconds on a busy 2-core machine)
    seconds, text = _first_token_s(http_port)
    stats = _replica_stats(http_port)
    stages = stats["model_load_stages"]
    print(f"\nfirst token {seconds:.2f} s after the request; the load's stages: "
          + ", ".join(f"{k} {v:.2f}" for k, v in stages.items()))
    assert text == answer and stats["model_state"] == "loaded" and stats["model_loads"] == 2
    assert stats["spare"]["taken"] == 1 and stats["spare"]["pid"] is None and stages["spare"] == 1.0
    log = " ".join(server.tail(100_000).split())  # Jina's log wraps its lines
    assert f"model {NAME} ready in {stages['total']:.2f} s, a spare" in log

    metrics = requests.get(f"http://127.0.0.1:{http_port}/metrics", timeout=30).text
    waits = _samples(metrics, "llm:model_load_wait_seconds_count")
    assert list(waits.values()) == [1.0] and f'model_name="{NAME}"' in next(iter(waits)), waits
    by_stage = {key.split('stage="')[1].split('"')[0]: v for key, v in _samples(metrics, "llm:model_load_stage_seconds{").items()}
    assert set(by_stage) == {"spawn", "imports", "load", "engine", "handover", "total", "spare"}, by_stage
    assert by_stage["spare"] == 1.0 and by_stage["total"] == pytest.approx(stages["total"])

    [running] = requests.get(f"http://127.0.0.1:{http_port}/api/ps", timeout=30).json()["models"]
    assert running["name"] == f"{NAME}:latest" and {"expires_at", "size_vram", "context_length", "digest"} <= set(running)
    assert running["load_duration"] >= round(stages["total"] * 1e9) > 0  # ns, the wait for the last load


def test_a_load_that_fails_names_the_model_and_the_service_serves_on(flow):
    http_port, folder, _, _ = flow
    answer = _generate(http_port).json()["response"]
    _unload(http_port)
    folder.rename(folder.with_name("away"))
    try:
        failed = _generate(http_port)
        assert failed.status_code >= 500 and f"could not load {NAME}" in failed.json()["error"], failed.text
        assert requests.get(f"http://127.0.0.1:{http_port}/health", timeout=30).status_code == 200
    finally:
        folder.with_name("away").rename(folder)
    again = _generate(http_port)
    assert again.status_code == 200 and again.json()["response"] == answer


def test_requests_that_wait_for_a_long_load_get_their_tokens(flow):
    """The spare stopped (SIGSTOP) for LONG_LOAD_S, so the load waits that long: a streamed and a
    whole request that wait for it get their tokens, no time limit met."""
    http_port, _, _, _ = flow
    answer = _generate(http_port).json()["response"]
    _unload(http_port)
    pid = _replica_stats(http_port)["spare"]["pid"]
    os.kill(pid, signal.SIGSTOP)
    resume = threading.Timer(LONG_LOAD_S, os.kill, (pid, signal.SIGCONT))
    resume.start()
    started = time.monotonic()
    try:
        with ThreadPoolExecutor(2) as pool:
            streamed, whole = pool.submit(_first_token_s, http_port), pool.submit(_generate, http_port)
            assert streamed.result()[1] == answer and whole.result().json()["response"] == answer
    finally:
        resume.cancel()
        os.kill(pid, signal.SIGCONT)
    assert time.monotonic() - started >= LONG_LOAD_S and _replica_stats(http_port)["spare"]["taken"] >= 1


def test_the_service_stopped_while_the_spare_waits_leaves_no_process(flow):
    """SIGTERM to the Flow's own process, as a supervisor stops it: the executor closes, and its
    spare with it."""
    http_port, _, server, mark = flow
    _unload(http_port)
    assert _replica_stats(http_port)["spare"]["pid"] is not None
    server.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 20
    while (left := service_processes(mark)) and time.monotonic() < deadline:
        time.sleep(0.25)
    for leftover in left:
        leftover.kill()
    assert [" ".join(p.cmdline())[:80] for p in left] == []
