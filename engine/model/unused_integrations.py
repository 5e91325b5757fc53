"""transformers told, before its first import, that two optional packages the engine never uses
are missing, so that its model code does not import them.

Why: transformers imports its integrations with every installed package it knows as its model
code loads. Two of them cost the engine process's start (together 0.3 s of its imports, 3.7 s
to 3.4 s alone on this project's machine) and serve nothing here:
- SciPy: only the object-detection losses use it (training);
- Accelerate (it pulls torch.distributed's FSDP): device maps and offloading across devices; the
  engine places its model itself (loader.py) and passes no device_map.
Both stay installed (scikit-learn and PEFT need them) and importable: only transformers' answer
changes, and only in a process that had not imported transformers yet (the engine process, a
spare); elsewhere this does nothing. transformers asks `importlib.util.find_spec`, which answers
"not installed" for a module whose entry in sys.modules is None, and keeps its answer for the
life of the process (`functools.lru_cache`); so the entries are None while transformers' package
imports and answers, then removed. tests/unit/test_imports.py checks, in a fresh interpreter, that
the engine core's imports load neither, and that both import afterwards.
"""
import sys

UNUSED = ("scipy", "accelerate")


def leave_out() -> bool:
    """Whether transformers now takes UNUSED as missing (False: it had been imported already, or one
    of them was, and nothing changed)."""
    if "transformers" in sys.modules or any(name in sys.modules for name in UNUSED):
        return False
    for name in UNUSED:
        sys.modules[name] = None  # type: ignore[assignment]  # find_spec: not installed
    try:
        from transformers.utils import import_utils

        return not (import_utils.is_scipy_available() or import_utils.is_accelerate_available())
    finally:
        for name in UNUSED:
            del sys.modules[name]
