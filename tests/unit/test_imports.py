"""What each layer loads: the contract nothing heavy, the engine neither jina nor docarray, the
gateway, schemas and client no engine. The contract and the edges are checked in fresh
interpreters, started when the session's tests are collected (tests/conftest.py); the engine,
whose imports cost the most, from its source and its dependencies' declared requirements."""
import ast
import importlib.metadata
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHECKS = {  # name -> the modules one fresh interpreter imports
    "contract": "contract",
    "edges": "gateway.composite, schemas, client",  # all three in one process: their union loads no engine
}
# what the engine may import beside the standard library and the contract, by distribution
ENGINE_DEPENDENCIES = {"torch": "torch", "transformers": "transformers", "tokenizers": "tokenizers",
                       "llguidance": "llguidance", "gguf": "gguf", "safetensors": "safetensors", "numpy": "numpy",
                       "jinja2": "jinja2"}  # module -> distribution
_started: dict[str, subprocess.Popen] = {}


def start() -> None:
    """Every check's interpreter, started once."""
    for name, modules in CHECKS.items():
        if name not in _started:
            code = f"import sys, {modules}; print(' '.join(sorted({{m.split('.')[0] for m in sys.modules}})))"
            _started[name] = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE,
                                              stderr=subprocess.PIPE, text=True)


def loaded(name: str) -> set[str]:
    """The top-level packages the check's modules loaded."""
    start()
    out, err = _started[name].communicate(timeout=120)
    assert _started[name].returncode == 0, err
    return set(out.split())


def test_the_contract_loads_nothing_heavy():
    assert not loaded("contract") & {"torch", "transformers", "jina", "docarray", "engine", "executors", "grpc"}


def _requires(distribution: str, seen: set[str]) -> set[str]:
    """A distribution and everything it requires, transitively (its declared requirements)."""
    name = distribution.lower().replace("_", "-")
    if name in seen:
        return seen
    seen.add(name)
    try:
        requirements = importlib.metadata.requires(name) or []
    except importlib.metadata.PackageNotFoundError:
        return seen
    for requirement in requirements:
        if "extra ==" not in requirement:  # optional extras are not installed with it
            _requires(requirement.split(";")[0].split("[")[0].split(" ")[0].split("=")[0].split(">")[0].split("<")[0]
                      .split("!")[0].split("~")[0].strip(), seen)
    return seen


def test_the_engine_imports_neither_jina_nor_docarray():
    """Its modules import only the standard library, the contract, themselves and a few
    dependencies, none of which requires jina or docarray, however deep."""
    for path in (ROOT / "engine").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            for top in (name.split(".")[0] for name in names):
                assert top in sys.stdlib_module_names or top in ("contract", "engine") or top in ENGINE_DEPENDENCIES, \
                    f"{path.relative_to(ROOT)} imports {top}"
    needed: set[str] = set()
    for distribution in ENGINE_DEPENDENCIES.values():
        _requires(distribution, needed)
    assert not needed & {"jina", "docarray"} and "torch" in needed


def test_the_gateway_schemas_and_client_do_not_load_the_engine():
    # torch itself may load: docarray imports it whenever it is installed
    assert not loaded("edges") & {"engine", "executors", "transformers"}
