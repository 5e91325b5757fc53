"""The C kernels compiled where the engine runs, and bound from their one header (kernels.h).

They are compiled on the machine that runs them, with its C compiler (`$CC`, else `cc`; `-O3
-march=native -ffp-contract=off`, then `$LLM_KERNEL_FLAGS`), about 2 s. -ffp-contract=off keeps
every a * b + c two roundings, as arith.h's one arithmetic defines it, with any compiler and on
any CPU. `$LLM_KERNEL_FLAGS` narrow the path: `-mno-avx512f` builds the AVX2 version on an
AVX-512 CPU, and PORTABLE (`-mno-avx -mno-avx2 -mno-fma -mno-f16c`) the plain C one; each gives
the same bits (tests/unit/test_kernel_paths.py compares them). The library is kept in
`$LLM_KERNEL_CACHE` (else the user's cache folder, `llm-stream/kernels`) under a key of the
sources, the flags, the compiler's version and this CPU's model and feature flags, so the next
engine process (a replica restarted, the engine process replaced) loads it at once, and a build
never meets a CPU it was not made for. Where the folder cannot be written, the build goes to a
temporary file. Where no compiler builds them, `library()` is None and table.py picks PyTorch's
ops instead (the same guarantees of batched == alone, slower, and other bits).

The ctypes signatures and structures are read from kernels.h, so the C interface is written in
one place: a function or a field added there is bound here with no second declaration.
"""
import ctypes
import functools
import hashlib
import logging
import os
import platform
import re
import shlex
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Optional

from contract import settings

from ..cache_folder import cache_folder

log = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
HEADER = HERE / "kernels.h"
SOURCES = tuple(sorted(HERE.glob("*.c")))
INCLUDES = tuple(sorted(HERE.glob("*.h")))
FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC")
PORTABLE = "-mno-avx -mno-avx2 -mno-fma -mno-f16c"  # LLM_KERNEL_FLAGS for the plain C path, on any x86 CPU
SCALARS: dict[str, Any] = {"int": ctypes.c_int, "int64_t": ctypes.c_int64, "float": ctypes.c_float, "void": None}
_STRUCT = re.compile(r"typedef struct \{(?P<body>[^}]*)\} (?P<name>\w+);")
_FUNCTION = re.compile(r"^(?P<result>int|void) (?P<name>\w+)\((?P<params>[^)]*)\);", re.M)
_COMMENT = re.compile(r"/\*.*?\*/", re.S)
_CONSTANT = re.compile(r"^#define (?P<name>[A-Z][A-Z0-9_]*) (?P<value>-?\d+)\b", re.M)


def flags() -> tuple[str, ...]:
    """FLAGS, then the operator's `$LLM_KERNEL_FLAGS`."""
    return FLAGS + tuple(shlex.split(settings.read("LLM_KERNEL_FLAGS")))


class Unbuilt(OSError):
    """Why the kernels are not there (table.py says it when it falls back)."""


def _ctype(declaration: str, structs: dict[str, type]) -> Any:
    """`const float *x` -> c_void_p, `const LlamaLayer *layer` -> POINTER(LlamaLayer), `int64_t n` -> c_int64."""
    words = declaration.replace("*", " * ").replace("const ", "").split()
    base, pointer = words[0], "*" in words
    if pointer:
        return ctypes.POINTER(structs[base]) if base in structs else ctypes.c_void_p
    return structs[base] if base in structs else SCALARS[base]


def header(path: Path = HEADER) -> tuple[dict[str, type], dict[str, tuple[Any, list[Any]]]]:
    """kernels.h (this one, or another commit's) as ctypes: its structures (name -> Structure) and
    functions (name -> (result, params))."""
    text = _COMMENT.sub("", path.read_text())
    structs: dict[str, type] = {}
    for match in _STRUCT.finditer(text):
        fields: list[tuple[str, Any]] = []
        for line in filter(None, (x.strip() for x in match["body"].split(";"))):
            base, declarators = line.removeprefix("const ").split(None, 1)
            for name in (d.strip() for d in declarators.split(",")):
                name, _, count = name.rstrip("]").partition("[")  # `Weight qkv[3]`: an array of 3
                kind = _ctype(f"{base} {'*' if name.startswith('*') else ''}", structs)
                fields.append((name.lstrip("* "), kind * int(count) if count else kind))
        structs[match["name"]] = type(match["name"], (ctypes.Structure,), {"_fields_": fields})
    functions = {}
    for match in _FUNCTION.finditer(text):
        params = [p.strip() for p in match["params"].split(",") if p.strip() and p.strip() != "void"]
        functions[match["name"]] = (SCALARS[match["result"]], [_ctype(p, structs) for p in params])
    return structs, functions


STRUCTS, FUNCTIONS = header()
CONSTANTS = {m["name"]: int(m["value"]) for m in _CONSTANT.finditer(HEADER.read_text())}  # kernels.h's #defines


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


def find_compiler() -> str:
    """`$CC`, else cc, else gcc (Unbuilt where there is none)."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise Unbuilt("no C compiler")
    return compiler


def bind(library: ctypes.CDLL, missing_ok: bool = False, path: Path = HEADER) -> ctypes.CDLL:
    """A header's signatures on the library's functions (those it has, where `missing_ok`:
    another commit's kernels, bound from that commit's header: benchmarks/kernels/kernel_ab.py)."""
    for name, (result, params) in (FUNCTIONS if path == HEADER else header(path)[1]).items():
        function = getattr(library, name, None) if missing_ok else getattr(library, name)
        if function is not None:
            function.restype, function.argtypes = result, params
    return library


def library_with(extra: tuple[str, ...]) -> ctypes.CDLL:
    """The kernels built with `extra` flags after `flags()` (another path this CPU runs: the tests
    and benchmarks compare them), kept in the cache as the engine's own are; raises Unbuilt."""
    return _build(extra)


def _build(extra: tuple[str, ...] = ()) -> ctypes.CDLL:
    compiler = find_compiler()
    started = time.perf_counter()
    cached = _cache_path(compiler, extra)
    if cached is not None and cached.exists() and (built := _load(cached)) is not None:
        log.info("C kernels loaded from %s", cached)
    elif cached is not None:
        compile_into(compiler, cached, SOURCES, extra)
        built = ctypes.CDLL(str(cached))
        log.info("C kernels built in %.2f s, kept in %s", time.perf_counter() - started, cached.parent)
    else:
        with tempfile.TemporaryDirectory(prefix="llm-native-") as folder:
            target = Path(folder) / "kernels.so"
            compile_into(compiler, target, SOURCES, extra)
            built = ctypes.CDLL(str(target))  # stays mapped once the file is gone
        log.info("C kernels built in %.2f s", time.perf_counter() - started)
    return bind(built)


def _load(path: Path) -> Optional[ctypes.CDLL]:
    try:
        return ctypes.CDLL(str(path))
    except OSError as exc:  # a file this system cannot load: built again in its place
        log.warning("C kernels in %s not loaded (%s): building them again", path, exc)
        return None


def compile_into(compiler: str, target: Path, sources: tuple[Path, ...] = SOURCES, extra: tuple[str, ...] = ()) -> None:
    """The sources, with `flags()` (and `extra` after them: a test builds for a narrower CPU), into
    `target`, whole or not at all: concurrent builds each write a file of their own and the last
    rename wins, with the same bytes. Each source compiles in a process of its own, side by side
    (the attention's many shapes take most of the time), then they are linked."""
    with tempfile.TemporaryDirectory(prefix=".building-", dir=target.parent) as folder:
        objects = [Path(folder) / f"{source.stem}.o" for source in sources]
        with ThreadPoolExecutor(max_workers=len(sources)) as pool:
            list(pool.map(lambda pair: _run([compiler, *flags(), *extra, "-c", str(pair[0]), "-o", str(pair[1])]),
                          zip(sources, objects, strict=True)))
        partial = Path(folder) / "kernels.so"
        _run([compiler, *flags(), *extra, *map(str, objects), "-o", str(partial)])
        os.replace(partial, target)


def _run(command: list[str]) -> None:
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=120)
    except (OSError, subprocess.SubprocessError) as exc:
        raise Unbuilt(f"{command[0]}: {exc}") from None
    if done.returncode != 0:
        raise Unbuilt(f"{command[0]} failed: {done.stderr.strip()[-500:]}")


def _cache_path(compiler: str, extra: tuple[str, ...] = ()) -> Optional[Path]:
    """Where this build is kept, or None where the cache folder cannot be written."""
    folder = cache_folder("LLM_KERNEL_CACHE", "kernels")
    if folder is None:
        return None
    try:
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise Unbuilt(f"{compiler}: {exc}") from None
    key = hashlib.sha256()
    for part in (compiler, version, " ".join(flags() + extra), _cpu_identity()):
        key.update(part.encode() + b"\0")
    for source in (*SOURCES, *INCLUDES):
        key.update(source.name.encode() + b"\0" + source.read_bytes() + b"\0")
    return folder / f"kernels-{key.hexdigest()[:24]}.so"


def _cpu_identity() -> str:
    """The first CPU's model and feature flags: what -march=native compiles for."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() + platform.machine()
    wanted = ("model name", "flags", "Features", "CPU part")
    return "\n".join(dict.fromkeys(line for line in lines if line.split(":")[0].strip() in wanted))


def main() -> int:
    """`python -m engine.kernels.build`: the kernels built into the cache now (make model and make
    gemma), so that the service's first start loads them instead of compiling them (4.5 s on a
    2-core machine)."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    built = library()
    if built is None:
        print(f"C kernels not built: {why_unbuilt()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
