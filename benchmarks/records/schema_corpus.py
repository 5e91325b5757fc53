"""Real-world JSON schemas, collected offline, and how long the service takes to compile them.

There is no internet on the benchmark machine, so the corpus is what ships with the
installed packages: the JSON-schema metaschemas, setuptools' pyproject schemas, the Swagger 2.0
schema of jsonschema's own benchmarks, and the pydantic schemas of real API types (the openai
SDK's, huggingface_hub's inference types, FastAPI's OpenAPI model, LangChain's messages), plus
a committed set of agent tools' parameter schemas (schemas/tools.json). A source that is not
installed is skipped with a note, never an error.

Each schema is compiled as a request's would be: the size limit first, then
`GrammarCompiler._compile` (llguidance), then the first token mask, which is where llguidance
builds the lexer lazily: both are work a first request with that schema waits for.
"""
import dataclasses
import importlib
import inspect
import json
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

HERE = Path(__file__).resolve().parent


@dataclass
class Schema:
    source: str  # where it comes from (a package, or "tools")
    name: str
    text: str


@dataclass
class Compiled:
    source: str
    name: str
    bytes: int
    compile_ms: Optional[float] = None  # GrammarCompiler._compile, median of the repeats
    first_mask_ms: Optional[float] = None  # the fresh matcher's first token mask
    error: Optional[str] = None
    lenient: Optional[str] = None  # refused: "compiles", or why not, with x-guidance lenient added


# ----- the corpus -----
def _package_dir(module: str) -> Path:
    return Path(importlib.import_module(module).__file__).parent  # type: ignore[arg-type]


def metaschemas() -> Iterator[Schema]:
    """Every JSON-schema draft's metaschema and vocabularies (jsonschema's own data)."""
    root = _package_dir("jsonschema_specifications") / "schemas"
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        yield Schema("jsonschema-specifications", str(path.relative_to(root)), path.read_text())


def package_files() -> Iterator[Schema]:
    """Schemas that packages ship as data: setuptools' pyproject.toml schemas and the Swagger 2.0
    schema in jsonschema's benchmarks."""
    for path in sorted((_package_dir("setuptools") / "config").glob("*.schema.json")):
        yield Schema("setuptools", path.name, path.read_text())
    for swagger in sorted((_package_dir("jsonschema") / "benchmarks").glob("*/issue.json"))[:1]:  # Swagger 2.0's
        yield Schema("jsonschema", "swagger-2.0", json.dumps(json.loads(swagger.read_text())[0]["schema"]))


def _pydantic_models(module: str, keep: Callable[[str, type], bool]) -> Iterator[tuple[str, Any]]:
    import pydantic
    mod = importlib.import_module(module)
    for name in sorted(dir(mod)):
        value = getattr(mod, name)
        if inspect.isclass(value) and keep(name, value):
            yield name, pydantic.TypeAdapter(value)


def _is_model(prefix: str) -> Callable[[str, type], bool]:
    import pydantic
    return lambda _, cls: issubclass(cls, pydantic.BaseModel) and cls.__module__.startswith(prefix)


PYDANTIC_SOURCES: list[tuple[str, Callable[[], Callable[[str, type], bool]]]] = [
    ("openai.types", lambda: _is_model("openai.types")),  # the SDK's request and response objects
    ("openai.types.chat", lambda: _is_model("openai.types.chat")),
    # the Hugging Face inference API's tasks (dataclasses): each task's input and output
    ("huggingface_hub.inference._generated.types",
     lambda: lambda name, cls: dataclasses.is_dataclass(cls) and name.endswith(("Input", "Output"))),
    ("fastapi.openapi.models", lambda: lambda name, _: name in ("OpenAPI", "Operation", "Schema")),
    ("langchain_core.messages", lambda: lambda name, _: name in ("AIMessage", "HumanMessage", "ToolMessage")),
    ("langchain_core.documents", lambda: lambda name, _: name == "Document"),
]


def pydantic_schemas(notes: list[str]) -> Iterator[Schema]:
    """`model_json_schema()` of installed libraries' API types: what `response_format=Model` sends."""
    for module, keep in PYDANTIC_SOURCES:
        try:
            models = list(_pydantic_models(module, keep()))
        except ImportError as exc:
            notes.append(f"{module} skipped: {exc}")
            continue
        for name, adapter in models:
            try:
                yield Schema(module.split(".")[0], name, json.dumps(adapter.json_schema()))
            except Exception as exc:  # noqa: BLE001 - a type pydantic cannot describe is not ours to time
                notes.append(f"{module}.{name}: no JSON schema ({type(exc).__name__})")


def tool_schemas() -> Iterator[Schema]:
    """Agent tools' parameter schemas (function calling), committed in schemas/tools.json."""
    for tool in json.loads((HERE / "schemas" / "tools.json").read_text()):
        yield Schema("tools", tool["name"], json.dumps(tool["parameters"]))


def collect(notes: list[str]) -> list[Schema]:
    """The whole corpus, each distinct schema text once."""
    found = [*metaschemas(), *package_files(), *pydantic_schemas(notes), *tool_schemas()]
    seen: set[str] = set()
    return [s for s in found if not (s.text in seen or seen.add(s.text))]  # type: ignore[func-returns-value]


# ----- timing -----
def load_compiler(model: Path) -> Any:
    """The service's GrammarCompiler, with the model's tokenizer and the default limits."""
    from transformers import AutoTokenizer

    from contract import RequestLimits
    from engine.policies.structured import GrammarCompiler
    return GrammarCompiler(AutoTokenizer.from_pretrained(str(model)), RequestLimits())


def time_one(compiler: Any, schema: Schema, repeats: int) -> Compiled:
    """Size check, compile (median of `repeats`; `_compile` never reads the cache) and first mask,
    as a request with a new schema meets them; a refusal keeps the service's reason."""
    from contract import ValidationError
    result = Compiled(schema.source, schema.name, len(schema.text.encode()))
    try:
        compiler.limits.check_grammar("json_schema", schema.text)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            matcher = compiler._compile("json_schema", schema.text)
            times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        matcher.compute_bitmask()
        result.first_mask_ms = round(1000 * (time.perf_counter() - t0), 2)
        result.compile_ms = round(1000 * statistics.median(times), 2)
        if matcher.is_error():
            result.error = f"first mask: {matcher.get_error()[:300]}"
    except ValidationError as exc:
        result.error = str(exc)[:300]
        result.lenient = _lenient(compiler, schema.text)
    except Exception as exc:  # noqa: BLE001 - anything else is a finding, not a crash
        result.error = f"{type(exc).__name__}: {exc}"[:300]
    return result


def _lenient(compiler: Any, text: str) -> Optional[str]:
    """Whether a refused schema compiles with `"x-guidance": {"lenient": true}` in it, which a
    client may send (llguidance then ignores keywords and formats it does not implement)."""
    schema = json.loads(text)
    if not isinstance(schema, dict):
        return None
    try:
        compiler._compile("json_schema", json.dumps({**schema, "x-guidance": {"lenient": True}}))
        return "compiles"
    except Exception as exc:  # noqa: BLE001 - still refused
        return str(exc)[:200]


def summarize(results: list[Compiled]) -> dict:
    """Coverage and compile-time percentiles (compile, and compile plus first mask)."""
    ok = [r for r in results if r.error is None]
    both = sorted(round(r.compile_ms + r.first_mask_ms, 2) for r in ok)  # type: ignore[operator]
    compile_ms = sorted(r.compile_ms for r in ok)  # type: ignore[type-var]
    by_source: dict[str, list[int]] = {}
    for r in results:
        by_source.setdefault(r.source, [0, 0])[0] += r.error is None
        by_source[r.source][1] += 1
    return {"tried": len(results), "compiled": len(ok),
            "coverage": round(len(ok) / len(results), 3) if results else None,
            "compile_p50_ms": _pct(compile_ms, 50), "compile_p99_ms": _pct(compile_ms, 99),
            "compile_max_ms": max(compile_ms, default=None),
            "with_first_mask_p50_ms": _pct(both, 50), "with_first_mask_max_ms": max(both, default=None),
            "slowest": [f"{r.source}/{r.name}: {r.compile_ms} + {r.first_mask_ms} ms"
                        for r in sorted(ok, key=lambda r: -(r.compile_ms or 0))[:5]],
            "by_source": {k: f"{v[0]}/{v[1]}" for k, v in by_source.items()},
            "refused_but_lenient_ok": sum(r.lenient == "compiles" for r in results),
            "failures": [f"{r.source}/{r.name}: {r.error} (lenient: {r.lenient})" for r in results if r.error]}


def _pct(values: list[float], q: float) -> Optional[float]:
    import numpy as np
    return round(float(np.percentile(values, q)), 2) if values else None


def compile_corpus(model: Path, notes: list[str], repeats: int = 3) -> tuple[dict, list[Compiled]]:
    """(summary, per-schema results) over the whole corpus."""
    schemas = collect(notes)
    compiler = load_compiler(model)
    results = [time_one(compiler, s, repeats) for s in schemas]
    return summarize(results), results
