"""The engine's shape, checked from its source: one step that reads in a screen, one writer of
row state, and a developer's guide that names every module."""
import ast
from pathlib import Path

from engine.core.core import EngineCore
from engine.core.request import ROW_STATE

ROOT = Path(__file__).resolve().parents[2]
ENGINE = ROOT / "engine"
WRITER = ENGINE / "core" / "scheduler.py"
KV_WRITES = {"start", "grow", "fork", "free", "computed", "reset", "release"}  # KVCacheManager's


def _modules() -> list[Path]:
    return sorted(p for p in ENGINE.rglob("*.py"))


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def _row_state_writes(tree: ast.Module) -> list[int]:
    """Lines that assign a row's state: `x.computed = ...`, `x.generated += ...`, `x.state = ...`,
    or that change its generated list in place."""
    lines = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
            if isinstance(node, (ast.AugAssign, ast.AnnAssign)) and not isinstance(node.target, ast.Name) else []
        for target in targets:
            for t in ast.walk(target):
                if isinstance(t, ast.Attribute) and t.attr in ROW_STATE and isinstance(t.ctx, ast.Store):
                    lines.append(node.lineno)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
                "append", "extend", "insert", "pop", "clear") and isinstance(node.func.value, ast.Attribute) \
                and node.func.value.attr == "generated":
            lines.append(node.lineno)
    return lines


def _kv_writes(tree: ast.Module) -> list[int]:
    """Lines that call a KVCacheManager method that changes a block table (`self.kv.grow(...)`)."""
    return [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute) and node.func.attr in KV_WRITES
            and isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "kv"]


def test_only_the_scheduler_writes_a_rows_state():
    """The scheduler's `schedule` and `update` are the one writer: every other engine module only
    reads a row's tokens, counts and place, and none but it changes a block table."""
    writers = {str(p.relative_to(ROOT)): lines for p in _modules() if p != WRITER
               for lines in [_row_state_writes(_tree(p)) + _kv_writes(_tree(p))] if lines}
    assert writers == {}
    assert _row_state_writes(_tree(WRITER)) and _kv_writes(_tree(WRITER))  # the check sees what it looks for


def test_the_engine_step_reads_in_one_screen():
    tree = _tree(ENGINE / "core" / "core.py")
    core = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == EngineCore.__name__)
    lengths = {f.name: f.end_lineno - f.lineno + 1 for f in core.body  # type: ignore[operator]
               if isinstance(f, ast.FunctionDef)}
    assert max(lengths.values()) <= 20, {name: n for name, n in lengths.items() if n > 20}
    step = next(f for f in core.body if isinstance(f, ast.FunctionDef) and f.name == "step")
    calls = [n.func.attr for n in sorted((n for n in ast.walk(step) if isinstance(n, ast.Call)),
                                         key=lambda n: (n.lineno, n.col_offset)) if isinstance(n.func, ast.Attribute)]
    assert calls == ["_apply_aborts", "schedule", "_observe_admitted", "_start_masks", "_run", "_choose", "_failed",
                     "update", "_emit"]


def test_the_developers_guide_names_every_module():
    guide = (ROOT / "docs" / "DEVELOPING.md").read_text()
    layout = guide[guide.index("## Repository layout"):guide.index("## How a request flows")]
    packages = ["contract", "engine", "executors", "gateway", "schemas", "client"]
    modules = [p for package in packages for p in (ROOT / package).rglob("*") if p.suffix in (".py", ".c", ".h")
               and p.name != "__init__.py" and "node_modules" not in p.parts]
    missing = sorted(str(p.relative_to(ROOT)) for p in modules if p.name not in layout)
    assert missing == []


def test_the_executors_use_only_the_engines_public_face():
    """`from engine import ...` (engine/__init__.py's __all__), never a module inside the engine."""
    import engine
    reaching = {str(p.relative_to(ROOT)): sorted({f"{n.module}" for n in ast.walk(_tree(p)) if isinstance(n, ast.ImportFrom)
                                                  and (n.module or "").startswith("engine.")})
                for p in (ROOT / "executors").glob("*.py")}
    assert {path: modules for path, modules in reaching.items() if modules} == {}
    used = {a.name for p in (ROOT / "executors").glob("*.py") for n in ast.walk(_tree(p))
            if isinstance(n, ast.ImportFrom) and n.module == "engine" for a in n.names}
    assert used and used <= set(engine.__all__)


def test_the_executors_process_imports_no_model_code():
    """Its engine runs in a process of its own: the executor's process relays it, and importing
    the engine core, its kernels' builder and transformers' models there cost each Flow's start
    about 4 s of CPU (engine/__init__.py loads each public name when first used)."""
    import subprocess
    import sys
    heavy = ["engine.core.core", "engine.model.loader", "transformers.modeling_utils", "engine.frontend.in_process"]
    code = f"import sys, executors.llm_executor; print([m for m in {heavy!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"
