"""What each layer loads: the contract nothing heavy, the engine neither jina nor docarray, the
gateway, schemas and client no engine. The contract and the edges are checked in fresh
interpreters, started as the run starts (tests/conftest.py); the engine,
whose imports cost the most, from its source and its dependencies' declared requirements."""
import ast
import importlib.metadata
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHECKS = {  # name -> what one fresh interpreter runs (the modules it imports)
    "contract": "import contract",
    "edges": "import gateway.composite, schemas, client",  # all three in one process: their union loads no engine
    # the gateway's and the executor's modules, in a process that deploy/jina_cli.py starts
    "served": "from deploy.jina_cli import import_docarray_without_torch; import_docarray_without_torch(); "
              "import jina, gateway.composite, executors.llm_executor, engine.frontend.spare",
    "engine-process": "import engine.core.core_process",  # what an engine process imports before its config
}
THEN = {"served": "import torch", "engine-process": "import scipy, accelerate"}  # run after the check's loaded modules are listed: it must not fail
# what the engine may import beside the standard library and the contract, by distribution
ENGINE_DEPENDENCIES = {"torch": "torch", "transformers": "transformers", "tokenizers": "tokenizers",
                       "llguidance": "llguidance", "gguf": "gguf", "safetensors": "safetensors", "numpy": "numpy",
                       "jinja2": "jinja2", "huggingface_hub": "huggingface-hub"}  # module -> distribution
FOLDER = "LLM_TEST_IMPORTS"  # where the checks write what they loaded (set by start)
WAIT = 120.0  # seconds a check may take to import


def start() -> list[subprocess.Popen]:
    """Every check's interpreter, started once per run, by the process that starts the run (the
    pytest-xdist controller, idle otherwise): each writes the top-level packages it loaded to a
    file of the folder in $LLM_TEST_IMPORTS, whichever worker reads it."""
    folder = Path(tempfile.mkdtemp(prefix="llm-imports-"))
    os.environ[FOLDER] = str(folder)
    started = []
    for name, statement in CHECKS.items():
        target = folder / name
        code = (f"import os, sys, traceback\ntry:\n    {statement}\n"
                f"    out = ' '.join(sorted({{m.split('.')[0] for m in sys.modules}}))\n    {THEN.get(name, 'pass')}\n"
                f"except BaseException:\n    out = 'FAILED ' + traceback.format_exc()\n"
                f"open({str(target) + '.part'!r}, 'w').write(out)\nos.replace({str(target) + '.part'!r}, {str(target)!r})")
        started.append(subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL))
    return started


def loaded(name: str) -> set[str]:
    """The top-level packages the check's modules loaded (its interpreter started here if the
    run did not start it)."""
    if not os.environ.get(FOLDER):
        start()
    target = Path(os.environ[FOLDER]) / name
    deadline = time.monotonic() + WAIT
    while not target.exists():
        assert time.monotonic() < deadline, f"the {name} check wrote nothing in {WAIT:.0f} s"
        time.sleep(0.05)
    out = target.read_text()
    assert not out.startswith("FAILED"), out
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


def test_the_processes_jina_starts_do_without_torch():
    """As deploy/jina_cli.py starts them, the gateway's and the executor's processes import no
    PyTorch (1.3 s and about 190 MB each, paid again by every replica): only the engine process
    computes with it. PyTorch stays importable afterwards (THEN), for the embedder and an
    in-process engine."""
    served = loaded("served")
    assert {"jina", "docarray", "executors", "gateway", "transformers"} <= served
    assert "torch" not in served


def test_the_request_the_executor_sends_the_engine_process_names_no_class_of_the_edges():
    """The executor pickles each request to the engine process, which unpickles it: a value of a
    schemas type (the seed, a `schemas.Seed`) would have it import schemas, DocArray and pydantic
    at the first request. Every request field of the contract is set, through the protobuf wire."""
    import io
    import pickle

    from executors.convert import to_request
    from schemas import PromptDocument
    doc = PromptDocument(prompt="Hello", seed=7, stop=["x"], max_tokens=4, temperature=0.5, top_k=3,
                         ignore_eos=True, choice=["a", "b"], resume_tokens=[1, 2], keep_alive=60)
    doc = PromptDocument.from_protobuf(doc.to_protobuf())
    named: set[str] = set()

    class Recording(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> object:
            named.add(module.split(".")[0])
            return super().find_class(module, name)

    request = Recording(io.BytesIO(pickle.dumps(to_request(doc)))).load()
    assert request[1].seed == 7 and type(request[1].seed) is int
    assert named == {"contract"}, named


def test_the_engine_process_leaves_out_what_transformers_would_load_for_nothing():
    """transformers' model code imports SciPy and Accelerate when installed (0.45 s of the engine
    process's start); the engine uses neither, and transformers is told they are missing
    (engine/model/unused_integrations.py). Both stay importable afterwards (THEN)."""
    engine = loaded("engine-process")
    assert {"torch", "transformers", "engine"} <= engine
    assert not engine & {"scipy", "accelerate"}
