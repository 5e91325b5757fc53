"""The engine process started ahead by the launcher (engine/core/ahead_process.py) and claimed by an
executor (engine/frontend/ahead.py): one executor claims it, the next starts its own, an unclaimed
one stops waiting, and a claimed process is waited on and killed though this process did not start
it. The process side runs on a thread here (its socket and answer; its imports are the engine's)."""
import os
import subprocess
import threading
import time
import uuid
from typing import Optional

import pytest

from engine.core import ahead_process
from engine.frontend import ahead


@pytest.fixture
def listening(monkeypatch):
    """A socket listening as the process started ahead does, named in LLM_ENGINE_AHEAD, and the
    thread that accepts its first connection, as that process's does: (its result, the thread)."""
    name = f"llm-engine-test-{uuid.uuid4().hex[:12]}"
    monkeypatch.setenv(ahead.AHEAD, name)
    listener = ahead_process.listen(name)
    accepted: list = []
    thread = threading.Thread(target=lambda: accepted.append(ahead_process.claim_first(listener, 10)), daemon=True)
    thread.start()
    yield accepted, thread
    thread.join(10)
    for conn in accepted:
        if conn is not None:
            conn.close()


@pytest.mark.parametrize("value", [None, "off", "llm-engine-nobody-listens"])
def test_no_process_to_claim_is_none(monkeypatch, value: Optional[str]):
    if value is None:
        monkeypatch.delenv(ahead.AHEAD, raising=False)
    else:
        monkeypatch.setenv(ahead.AHEAD, value)
    assert ahead.claim_ahead() is None


def test_the_first_executor_claims_it_and_the_next_starts_its_own(listening):
    accepted, thread = listening
    core = ahead.claim_ahead()
    assert core is not None and core.process.pid == os.getpid()  # the process that answered: here, this one
    assert core.spawned_at == ahead_process.STARTED
    assert ahead.claim_ahead() is None  # it listens no more
    thread.join(10)
    from multiprocessing.connection import Connection
    conn = accepted[0]
    core.commands.send("the config, first")  # what the executor writes reaches the claimed end
    assert Connection(os.dup(conn.fileno()), writable=False).recv() == "the config, first"
    Connection(os.dup(conn.fileno()), readable=False).send("ready")
    assert core.outputs.recv() == "ready"
    core.commands.close()
    core.outputs.close()


def test_an_unclaimed_process_stops_waiting():
    listener = ahead_process.listen(f"llm-engine-test-{uuid.uuid4().hex[:12]}")
    started = time.monotonic()
    assert ahead_process.claim_first(listener, 0.2) is None
    assert 0.15 < time.monotonic() - started < 5 and listener.fileno() == -1  # closed


def test_a_claimed_process_is_waited_on_and_killed_though_another_started_it():
    """`sleep` started by a shell that exits: this process is not its parent."""
    shell = subprocess.run(["sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True, check=True)
    process = ahead.ClaimedProcess(int(shell.stdout))
    assert process.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        process.wait(0.1)
    process.kill()
    assert process.wait(10) == ahead.EXIT_UNKNOWN and process.poll() == ahead.EXIT_UNKNOWN
