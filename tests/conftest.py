"""Shared fixtures: tiny models built on the spot, and real servers on random ports."""
import os
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.procs import ServerProcess, free_port  # noqa: E402
from benchmarks.toy_models import build  # noqa: E402


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def gpt2_model(models_dir) -> str:
    return str(build(models_dir / "gpt2", "gpt2"))


@pytest.fixture(scope="session")
def llama_model(models_dir) -> str:
    return str(build(models_dir / "llama", "llama"))


@pytest.fixture(scope="session", params=["gpt2", "llama"])
def any_model(request, gpt2_model, llama_model) -> str:
    return gpt2_model if request.param == "gpt2" else llama_model


def start_flow(model: str, tmp_path: Path, executor: dict | None = None, env: dict | None = None,
               **limits) -> tuple[ServerProcess, int, int]:
    """`jina flow --uses flows/llm.yml` as `make serve` runs it, on random ports; `limits`
    (max_running=..., ...) go to a copy of the flow file, `executor` replaces fields of its
    executor (another `uses`, say), the gateway unchanged; `env` adds to the environment."""
    flow_file = "flows/llm.yml"
    if limits or executor:
        import yaml
        flow = yaml.safe_load((ROOT / flow_file).read_text())
        flow["executors"][0].setdefault("uses_with", {}).update(limits)
        flow["executors"][0].update(executor or {})
        flow_file = str(tmp_path / "flow.yml")
        Path(flow_file).write_text(yaml.safe_dump(flow, sort_keys=False))
    grpc_port, http_port = free_port(), free_port()
    env = dict(os.environ, LLM_MODEL=model, LLM_GRPC_PORT=str(grpc_port),
               LLM_HTTP_PORT=str(http_port), JINA_LOG_LEVEL="INFO", **(env or {}))
    jina = str(Path(sys.executable).parent / "jina")
    server = ServerProcess([jina, "flow", "--uses", flow_file], tmp_path / "flow.log", env)
    try:
        server.wait_port(grpc_port, 120)
        server.wait_port(http_port, 120)
        _wait_ready(http_port)
    except Exception:
        server.stop()
        raise RuntimeError("flow did not start:\n" + server.tail(4000)) from None
    return server, grpc_port, http_port


def _wait_ready(http_port: int, timeout: float = 120.0) -> None:
    import urllib.request
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError("flow not ready")


@pytest.fixture(scope="session")
def flow(gpt2_model, tmp_path_factory):
    """One real Flow for the whole session: (grpc_port, http_port)."""
    server, grpc_port, http_port = start_flow(gpt2_model, tmp_path_factory.mktemp("flow"))
    yield grpc_port, http_port
    server.stop()


@pytest.fixture(scope="session")
def slow_model(models_dir) -> str:
    """Tens of ms per token here: a generation that is surely still running when cancelled."""
    return str(build(models_dir / "slow", "gpt2", "slow"))


@pytest.fixture(scope="session")
def slow_flow(slow_model, tmp_path_factory):
    """A second real Flow, on the slow model, for cancellation tests: (grpc_port, http_port)."""
    server, grpc_port, http_port = start_flow(slow_model, tmp_path_factory.mktemp("slow_flow"))
    yield grpc_port, http_port
    server.stop()


@pytest.fixture(scope="session")
def real_model() -> str:
    """The trained default model (`make model`). `make test` sets LLM_TEST_MODEL, so there a
    missing model fails the run; a bare `pytest` without it skips this tier."""
    path = os.environ.get("LLM_TEST_MODEL")
    if path is None:
        path = str(ROOT / "models" / "SmolLM2-135M-Instruct")
        if not (Path(path) / "config.json").exists():
            pytest.skip("the real model is absent: run `make model` (make test does)")
    if not (Path(path) / "config.json").exists():
        pytest.fail(f"LLM_TEST_MODEL={path} holds no model: run `make model`")
    return str(Path(path).resolve())


@pytest.fixture(scope="session")
def real_flow(real_model, tmp_path_factory):
    """A real Flow on the trained model: (grpc_port, http_port)."""
    server, grpc_port, http_port = start_flow(real_model, tmp_path_factory.mktemp("real_flow"))
    yield grpc_port, http_port
    server.stop()
