"""Every shell line of the README's code blocks, and of docs/models.md's, runs here as a user would
type it: `make serve` in each form they show and the curls against what it started (a line both
show runs once). Where a line names a placeholder
(`/path/to/local/model`) a real model of that kind stands in, and the ports it names (12345, 12346,
50051, 8080) become free ones. The tiny models' services run without the embedding executor
(`LLM_EMBEDDING_MODEL=`), which only the quick start and the two-model start show. Each service is
stopped as a user stops it, SIGINT to its process group, and must leave no process behind. The
Python blocks run in tests/real_model/test_readme_code.py, the console examples in
test_doc_examples.py."""
import json
import os
import re
import signal
import subprocess
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import psutil
import pytest

from testing.procs import ROOT, free_port, service_processes

DOCUMENTS = ("README.md", "docs/models.md")


def shell_lines(document: str) -> list[str]:
    return [line for block in re.findall(r"^```bash\n(.*?)^```", (ROOT / document).read_text(), flags=re.S | re.M)
            for line in block.splitlines() if line.strip()]


README_LINES = sorted({line for document in DOCUMENTS for line in shell_lines(document)})
# the test targets: the suite itself (`.ci/run` runs `make test`), and the ones docs/DEVELOPING.md
# lists (its fast tiers, lint, the soak and the GPU tier). `make -n` resolves each here: it still
# exists and runs pytest (lint: ruff).
MAKE_TARGETS = [line for line in README_LINES if re.match(r"make (test|test-fast|soak|test-gpu) ", line)]
DEVELOPING_TARGETS = [line for line in shell_lines("docs/DEVELOPING.md") if line.startswith("make ")]


def readme_line(start: str) -> str:
    """The documents' one shell line that starts so (its comment included)."""
    found = [line for line in README_LINES if line.startswith(start)]
    assert len(found) == 1, f"README.md and docs/models.md have {len(found)} shell lines starting {start!r}"
    return found[0]


@dataclass(frozen=True)
class Service:
    """A `make serve` line of the README, the README's lines run against what it starts, and the
    stand-in model for LLM_MODEL or its placeholder (a fixture's name; none: as the line says)."""
    line: str
    then: tuple[str, ...] = ()
    model: str = ""
    adapter: str = ""  # the fixture that stands in for /path/to/peft-adapter


QUICK_START = Service(readme_line("make serve "), then=(readme_line("curl http://localhost:12346/v1/chat/completions"),
                                                         readme_line("curl -N http://localhost:12346/v1/chat/completions")))
TWO_MODELS = Service(readme_line("LLM_MODELS="), then=(readme_line("curl localhost:12346/v1/models"),))
OTHER_MODELS = [
    Service(readme_line("LLM_MODEL=/path/to/local/model make serve"), model="gpt2_model"),
    Service(readme_line("LLM_MODEL=/path/to/model.Q4_K_M.gguf make serve"), model="default_gguf"),
    Service(readme_line("LLM_MODEL=/path/to/hf-folder make serve"), model="bf16_smol"),
    Service(readme_line("LLM_MODEL_NAME=my-model make serve"), model="gpt2_model"),
    Service(readme_line("LLM_GRPC_PORT=50051 LLM_HTTP_PORT=8080 make serve"), model="gpt2_model"),
    Service(readme_line("make toy-model serve LLM_MODEL=models/tiny-gpt2")),
]
ADAPTER = Service(readme_line("LLM_LORA="), adapter="default_adapter")
QUANTIZE = readme_line(".venv/bin/python -m engine.quantize")


def test_every_shell_line_of_the_documents_is_run_here():
    assert shell_lines("README.md") and shell_lines("docs/models.md")
    covered = [s.line for s in (QUICK_START, TWO_MODELS, ADAPTER, *OTHER_MODELS)] + [t for s in (QUICK_START, TWO_MODELS)
                                                                                  for t in s.then]
    covered += MAKE_TARGETS + [QUANTIZE]
    assert sorted(covered) == README_LINES


@pytest.mark.parametrize("line", sorted(set(MAKE_TARGETS + DEVELOPING_TARGETS)))
def test_the_test_targets_resolve(line):
    target = line.split()[1]
    dry = subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    assert ("ruff check" if target == "lint" else "pytest") in dry.stdout


class Started:
    """The line running in a shell of its own process group, its ports free ones."""

    def __init__(self, service: Service, model: str, tmp: Path, adapter: str = ""):
        self.mark, self.grpc, self.http = uuid.uuid4().hex, free_port(), free_port()
        line = service.line.replace("/path/to/peft-adapter", adapter)
        for standin in ("/path/to/local/model", "/path/to/model.Q4_K_M.gguf", "/path/to/hf-folder"):
            line = line.replace(standin, model)
        self.line = self.ports(line)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LLM_MODEL", "LLM_REPLICAS", "LLM_GRPC", "LLM_HTTP"))}
        env.update(LLM_TEST_MARK=self.mark, LLM_GRPC_PORT=str(self.grpc), LLM_HTTP_PORT=str(self.http))
        if service.model:
            env.update(LLM_MODEL=model, LLM_EMBEDDING_MODEL="")
        elif "tiny" in line or service.adapter:
            env.update(LLM_EMBEDDING_MODEL="")
        self.log = tmp / f"{self.mark}.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(["bash", "-c", self.line], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)

    def ports(self, line: str) -> str:
        for port, free in (("12345", self.grpc), ("50051", self.grpc), ("12346", self.http), ("8080", self.http)):
            line = line.replace(port, str(free))
        return line

    def models(self, timeout: float = 240, expect: Optional[list[str]] = None) -> list[str]:
        """The ids /v1/models lists once the Flow says it is ready (its HTTP app answers a moment
        before the last executor is reached, and the embedding model is listed from then on)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"{self.line!r} exited {self.proc.returncode}:\n{self.log.read_text()[-3000:]}"
            if "Flow is ready to serve" not in self.log.read_text(errors="replace"):
                time.sleep(0.5)
                continue
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/v1/models", timeout=5) as r:
                    listed = [m["id"] for m in json.load(r)["data"]]
                if expect is None or listed == expect or time.monotonic() > deadline - timeout + 60:
                    return listed  # (a listing still short a minute after the start is returned as it is)
                time.sleep(0.5)
                continue
            except OSError:
                time.sleep(0.5)
        raise AssertionError(f"{self.line!r} did not answer in {timeout:.0f} s:\n{self.log.read_text()[-3000:]}")

    def shell(self, line: str) -> str:
        out = subprocess.run(["bash", "-c", self.ports(line)], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return out.stdout

    def stop(self) -> list[str]:
        """SIGINT to the group, as Ctrl-C does; what is left of the service 30 s later (then killed)."""
        try:
            os.killpg(self.proc.pid, signal.SIGINT)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + 30
        while (left := self.leftovers()) and time.monotonic() < deadline:
            time.sleep(0.25)
        for process in left:
            process.kill()
        self.proc.wait(10)
        return [" ".join(p.cmdline())[:80] for p in left]

    def leftovers(self) -> list[psutil.Process]:
        return service_processes(self.mark)


def run(service: Service, model: str, tmp: Path, check, adapter: str = "") -> None:
    """Start the line, check what it serves, stop it: nothing of it may be left."""
    started = Started(service, model, tmp, adapter)
    try:
        check(started, started.models())
    finally:
        assert started.stop() == []


def test_the_quick_start_serves_and_its_curl_answers(real_model, tmp_path):
    def check(started: Started, ids: list[str]) -> None:
        assert ids == ["SmolLM2-135M-Instruct", "all-MiniLM-L6-v2"]
        answer = json.loads(started.shell(QUICK_START.then[0]))
        assert answer["model"] == "SmolLM2-135M-Instruct"
        text = answer["choices"][0]["message"]["content"]
        assert text.strip() and answer["usage"]["completion_tokens"] > 0
        streamed = started.shell(QUICK_START.then[1]).splitlines()
        events = [line.removeprefix("data: ") for line in streamed if line.startswith("data: ")]  # (beside `id:`)
        assert events[-1] == "[DONE]"  # the same answer, streamed: one delta at a time
        assert "".join(json.loads(e)["choices"][0]["delta"].get("content") or "" for e in events[:-1]) == text
    run(QUICK_START, "", tmp_path, check)


def test_the_two_model_start_serves_both(real_model, gguf_model, tmp_path):
    served = ["SmolLM2-135M-Instruct", "gemma-3-270m-q4_k_m", "all-MiniLM-L6-v2"]

    def check(started: Started, ids: list[str]) -> None:
        ids = started.models(expect=served)  # the embedder can be listed a moment after the Flow is ready
        listed = [m["id"] for m in json.loads(started.shell(TWO_MODELS.then[0]))["data"]]
        assert listed == ids == served
    run(TWO_MODELS, "", tmp_path, check)


@pytest.mark.parametrize("service", OTHER_MODELS, ids=lambda s: s.line.split(" make")[0].split("/")[-1][:24])
def test_each_other_model_line_serves(service, request, tmp_path):
    model = request.getfixturevalue(service.model) if service.model else ""
    expected = ("my-model" if "LLM_MODEL_NAME" in service.line else
                Path(model).stem if model.endswith(".gguf") else Path(model or "models/tiny-gpt2").name)

    def check(started: Started, ids: list[str]) -> None:
        assert ids == [expected]
        body = json.dumps({"model": expected, "prompt": "Hello", "max_tokens": 4, "temperature": 0}).encode()
        post = urllib.request.Request(f"http://127.0.0.1:{started.http}/v1/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(post, timeout=60) as r:
            assert json.load(r)["usage"]["completion_tokens"] == 4
    run(service, model, tmp_path, check)


def _completes(started: Started, model: str) -> None:
    body = json.dumps({"model": model, "prompt": "Hello", "max_tokens": 4, "temperature": 0}).encode()
    post = urllib.request.Request(f"http://127.0.0.1:{started.http}/v1/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(post, timeout=60) as r:
        assert json.load(r)["usage"]["completion_tokens"] == 4


def test_the_adapter_line_serves_the_adapter_beside_the_model(real_model, default_adapter, tmp_path):
    def check(started: Started, ids: list[str]) -> None:
        assert ids == ["SmolLM2-135M-Instruct", "SmolLM2-135M-Instruct:sql"]
        _completes(started, "SmolLM2-135M-Instruct:sql")
    run(ADAPTER, "", tmp_path, check, default_adapter)


def test_the_quantize_line_writes_a_gguf_this_service_reads(bf16_smol, tmp_path):
    line = QUANTIZE.replace("/path/to/hf-folder", bf16_smol).replace("model.Q8_0.gguf", str(tmp_path / "model.Q8_0.gguf"))
    env = {**os.environ, "LLM_QUANT_CACHE": str(tmp_path / "cache")}
    done = subprocess.run(["bash", "-c", line], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    written = json.loads(done.stdout.strip().splitlines()[-1])
    assert written["type"] == "q8_0" and (tmp_path / "model.Q8_0.gguf").stat().st_size == written["bytes"]
