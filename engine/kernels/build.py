"""The C kernels compiled where the engine runs, and bound from their one header (kernels.h).

They are compiled on the machine that runs them, with its C compiler (`$CC`, else `cc`; `-O3
-march=native`), into a temporary file: under a second, and nothing is cached on disk, so a
build never meets a CPU it was not made for. Where no compiler builds them, `library()` is None
and table.py picks PyTorch's ops instead (the same guarantees, slower).

The ctypes signatures and structures are read from kernels.h, so the C interface is written in
one place: a function or a field added there is bound here with no second declaration.
"""
import ctypes
import functools
import logging
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

log = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
HEADER = HERE / "kernels.h"
SOURCES = tuple(sorted(HERE.glob("*.c")))
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC")
SCALARS: dict[str, Any] = {"int": ctypes.c_int, "int64_t": ctypes.c_int64, "float": ctypes.c_float, "void": None}
_STRUCT = re.compile(r"typedef struct \{(?P<body>[^}]*)\} (?P<name>\w+);")
_FUNCTION = re.compile(r"^(?P<result>int|void) (?P<name>\w+)\((?P<params>[^)]*)\);", re.M)
_COMMENT = re.compile(r"/\*.*?\*/", re.S)


class Unbuilt(OSError):
    """Why the kernels are not there (table.py says it when it falls back)."""


def _ctype(declaration: str, structs: dict[str, type]) -> Any:
    """`const float *x` -> c_void_p, `const LlamaLayer *layer` -> POINTER(LlamaLayer), `int64_t n` -> c_int64."""
    words = declaration.replace("*", " * ").replace("const ", "").split()
    base, pointer = words[0], "*" in words
    if pointer:
        return ctypes.POINTER(structs[base]) if base in structs else ctypes.c_void_p
    return structs[base] if base in structs else SCALARS[base]


def header() -> tuple[dict[str, type], dict[str, tuple[Any, list[Any]]]]:
    """kernels.h as ctypes: its structures (name -> Structure) and functions (name -> (result, params))."""
    text = _COMMENT.sub("", HEADER.read_text())
    structs: dict[str, type] = {}
    for match in _STRUCT.finditer(text):
        fields: list[tuple[str, Any]] = []
        for line in filter(None, (x.strip() for x in match["body"].split(";"))):
            base, declarators = line.removeprefix("const ").split(None, 1)
            for name in (d.strip() for d in declarators.split(",")):
                fields.append((name.lstrip("* "), _ctype(f"{base} {'*' if name.startswith('*') else ''}", structs)))
        structs[match["name"]] = type(match["name"], (ctypes.Structure,), {"_fields_": fields})
    functions = {}
    for match in _FUNCTION.finditer(text):
        params = [p.strip() for p in match["params"].split(",") if p.strip() and p.strip() != "void"]
        functions[match["name"]] = (SCALARS[match["result"]], [_ctype(p, structs) for p in params])
    return structs, functions


STRUCTS, FUNCTIONS = header()


def library() -> Optional[ctypes.CDLL]:
    """The compiled kernels, or None where they cannot be built (`why_unbuilt` says why)."""
    return _built()[0]


def why_unbuilt() -> str:
    return _built()[1]


@functools.cache
def _built() -> tuple[Optional[ctypes.CDLL], str]:
    try:
        return _build(), ""
    except Unbuilt as exc:
        log.warning("C kernels not built (%s): PyTorch's ops run instead (slower)", exc)
        return None, str(exc)


def _build() -> ctypes.CDLL:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise Unbuilt("no C compiler")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="llm-native-") as folder:
        target = Path(folder) / "kernels.so"
        try:
            done = subprocess.run([compiler, *FLAGS, *map(str, SOURCES), "-o", str(target)],
                                  capture_output=True, text=True, check=False, timeout=120)
        except (OSError, subprocess.SubprocessError) as exc:
            raise Unbuilt(f"{compiler}: {exc}") from None
        if done.returncode != 0:
            raise Unbuilt(f"{compiler} failed: {done.stderr.strip()[-500:]}")
        built = ctypes.CDLL(str(target))  # stays mapped once the file is gone
    for name, (result, params) in FUNCTIONS.items():
        function = getattr(built, name)
        function.restype, function.argtypes = result, params
    log.info("C kernels built in %.2f s", time.perf_counter() - started)
    return built
