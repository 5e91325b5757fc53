"""llama.cpp as `make llama-cpp` builds it: its server, llama-quantize for a Q4_0 copy of the
default model's GGUF, and its Python bindings (llama-cpp-python's own, from the same pinned
source) to read its logits."""
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
BUILT = ROOT / "benchmarks" / ".llama.cpp"
LLAMA_SERVER = BUILT / "llama-server"
LLAMA_QUANTIZE = BUILT / "llama-quantize"
Q4_0_DIR = ROOT / "benchmarks" / ".models" / "gguf-q4_0"
DEPS = BUILT / "deps"  # what the bindings and the converter import that .venv does not pin
SOURCE = BUILT / "src" / "vendor" / "llama.cpp"  # the pinned source: convert_hf_to_gguf.py and gguf-py


def _built(binary: Path) -> Path:
    if not binary.exists():
        raise RuntimeError(f"{binary.name} is not built: run `make llama-cpp` (about 10 minutes)")
    return binary


def q4_0_of(source: Path) -> Path:
    """A Q4_0 GGUF of `source`'s weights, made once by llama-quantize: requantized from the
    file's own 4-bit weights (`--allow-requantize`), the types llama.cpp's Q4_0 preset picks for
    each tensor. Q4_0 is the format that llama.cpp's CPU backend repacks for its fastest kernels."""
    target = Q4_0_DIR / source.name.replace("Q4_1", "Q4_0").replace("q4_1", "q4_0")
    if target == Q4_0_DIR / source.name:
        target = Q4_0_DIR / f"{source.stem}-Q4_0.gguf"
    if target.exists():
        return target
    return quantize(source, target, "Q4_0", "--allow-requantize")


def requantized(source: Path, kind: str) -> Path:
    """A `kind` GGUF of `source`'s weights, made once by llama-quantize from the file's own weights
    (`--allow-requantize`), the types llama.cpp's `kind` preset picks for each tensor."""
    target = Q4_0_DIR / f"{source.stem}-{kind}.gguf"
    return target if target.exists() else quantize(source, target, kind, "--allow-requantize")


def quantize(source: Path, target: Path, kind: str, *options: str) -> Path:
    """`target`: llama-quantize's `kind` (Q4_K_M, Q4_0, Q8_0...) of the GGUF file `source`, written
    whole or not at all."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    subprocess.run([str(_built(LLAMA_QUANTIZE)), *options, str(source), str(partial), kind, "2"],
                   check=True, capture_output=True, env={"LD_LIBRARY_PATH": str(BUILT)})
    partial.rename(target)
    return target


def source() -> Path:
    """The pinned llama.cpp source, unpacked (without building) the first time."""
    if not (SOURCE / "convert_hf_to_gguf.py").exists():
        subprocess.run(["bash", str(ROOT / "benchmarks" / "peers" / "build_llama_cpp.sh"), "--source"], check=True,
                       cwd=ROOT)
    return SOURCE


def bindings() -> Any:
    """The `llama_cpp` module (llama-cpp-python's bindings) over the libraries built here."""
    _built(BUILT / "src" / "llama_cpp" / "lib")
    for folder in (DEPS, BUILT / "src"):
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
    import llama_cpp
    return llama_cpp
