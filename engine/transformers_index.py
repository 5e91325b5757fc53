"""transformers' index of its model folders, read from disk instead of made at each import.

Why: `import transformers` walks its 550 model folders and reads some 1,700 source files to learn
which names each one exports (`create_import_structure_from_path`, for its lazy modules), and
importing `transformers.models` walks them again (the walk's `lru_cache` holds 128 folders). That
is 0.36 s of every engine process's start, and of the executor's, on the 2 cores they share while
the service starts. The index is a function of the installed files, so it is kept, pickled, in the
user's cache folder (`LLM_IMPORTS_CACHE`), under a key made of the models folder's path and the
times its folder and `__init__.py` were last changed (an upgrade rewrites both), and read back in
a millisecond. A cache that cannot be read or written costs only the walk.

`install()` must run before transformers' first import in the process (engine/__init__.py runs it):
transformers binds the walk's function as its package imports. It adds an import hook that wraps
the function as `transformers.utils.import_utils` loads; elsewhere nothing changes.
"""
import hashlib
import logging
import os
import pickle
import sys
from collections.abc import Callable, Sequence
from importlib.abc import MetaPathFinder
from importlib.machinery import ModuleSpec, PathFinder
from types import ModuleType
from typing import Any, Optional

log = logging.getLogger(__name__)
MODULE = "transformers.utils.import_utils"
WALK = "create_import_structure_from_path"


def install() -> bool:
    """Whether the hook is now in place (False: transformers was imported already)."""
    if MODULE in sys.modules or any(isinstance(f, _Hook) for f in sys.meta_path):
        return False
    sys.meta_path.insert(0, _Hook())
    return True


class _Hook(MetaPathFinder):
    """Finds transformers' import_utils as the path finder does, and wraps its walk once it ran."""

    def find_spec(self, fullname: str, path: Optional[Sequence[str]], target: Optional[ModuleType] = None
                  ) -> Optional[ModuleSpec]:
        if fullname != MODULE:
            return None
        sys.meta_path.remove(self)
        spec = PathFinder.find_spec(fullname, path, target)
        loader = spec.loader if spec is not None else None
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            walk = getattr(module, WALK, None)
            if callable(walk):
                setattr(module, WALK, kept(walk, os.path.join(os.path.dirname(os.path.dirname(module.__file__ or "")),
                                                              "models")))

        loader.exec_module = exec_module  # type: ignore[method-assign]  # this spec's loader only
        return spec


def kept(walk: Callable[[Any], dict], models: str) -> Callable[[Any], dict]:
    """`walk`, whose answer for the folder `models` (or its __init__.py) comes from the cache: a
    fresh copy at each call, as the walk makes (its callers reshape what they get)."""
    held: list[bytes] = []

    def cached_walk(module_path: Any) -> dict:
        folder = str(module_path)
        if os.path.isfile(folder):
            folder = os.path.dirname(folder)
        if folder != models:
            return walk(module_path)
        if not held:
            path = _file(models)
            kept_bytes = _read(path)
            if kept_bytes is None:
                index = walk(module_path)
                held.append(pickle.dumps(index, protocol=pickle.HIGHEST_PROTOCOL))
                _write(path, held[0])
                return index
            held.append(kept_bytes)
        return pickle.loads(held[0])

    cached_walk.__wrapped__ = walk  # type: ignore[attr-defined]  # the walk itself, as functools names it
    return cached_walk


def _file(models: str) -> Optional[str]:
    """Where the index of this installation is kept (None: nowhere)."""
    from .cache_folder import cache_folder  # the settings: only when transformers imports

    folder = cache_folder("LLM_IMPORTS_CACHE", "imports")
    try:
        stamps = [os.stat(models).st_mtime_ns, os.stat(os.path.join(models, "__init__.py")).st_mtime_ns]
    except OSError:
        return None
    if folder is None:
        return None
    key = hashlib.sha256(repr((models, stamps, sys.version_info[:2])).encode()).hexdigest()[:24]
    return str(folder / f"transformers-models-{key}.pickle")


def _read(path: Optional[str]) -> Optional[bytes]:
    """The kept index's bytes, if they are there and unpickle to an index."""
    if path is None or not os.path.exists(path):
        return None
    try:
        with open(path, "rb") as f:
            data = f.read()
        return data if isinstance(pickle.loads(data), dict) else None
    except Exception:  # noqa: BLE001 - a torn or foreign file: walk again
        log.debug("transformers' index at %s unreadable", path, exc_info=True)
        return None


def _write(path: Optional[str], data: bytes) -> None:
    if path is None:
        return
    scratch = f"{path}.{os.getpid()}"
    try:
        with open(scratch, "wb") as f:
            f.write(data)
        os.replace(scratch, path)  # whole or not at all, for a process reading it beside
    except OSError:
        log.debug("transformers' index not kept at %s", path, exc_info=True)
