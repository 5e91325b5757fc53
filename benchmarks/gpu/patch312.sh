#!/usr/bin/env bash
# Install-time patches so jina 3.34.0 + docarray 0.41.0 import and serve a Flow on CPython 3.12.
# One-off, for the 3.12-only benchmark machine; the product stays on 3.11. Patches the installed
# copies in the site folder given as $1 (e.g. /tmp/site312); idempotent (each patch is marked
# "[patch312]" and skipped when already there). Python to run the patcher: $PY, default python3.
#
#   python3.12 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site312 .whl/*.whl
#   PY=python3.12 bash benchmarks/gpu/patch312.sh /tmp/site312      # again after every (re)install
#   PYTHONPATH=/tmp/site312:$PWD python3.12 -c 'import jina, docarray'
#
# wheels.sh puts the runtime deps that are not 3.12 bugs (mypy_extensions, jcloud) in .whl/; the
# image has numpy. What is left is one docarray patch (below).
set -euo pipefail
SITE=${1:?usage: patch312.sh SITE_DIR}
PY=${PY:-python3}
[ -d "$SITE/docarray" ] && [ -d "$SITE/jina" ] || { echo "patch312: no docarray/jina under $SITE" >&2; exit 1; }
PYTHONPATH="$SITE" "$PY" -c "import numpy, mypy_extensions, jcloud" || { echo "patch312: missing deps" >&2; exit 1; }

"$PY" - "$SITE" <<'EOF'
import pathlib, sys

site = pathlib.Path(sys.argv[1])
MARK = "[patch312]"


def patch(rel: str, old: str, new: str, why: str) -> None:
    path = site / rel
    text = path.read_text()
    if MARK in new and new in text:
        print(f"patch312: {rel}: already patched ({why})")
        return
    if text.count(old) != 1:
        sys.exit(f"patch312: {rel}: expected exactly one match for the patch ({why}), found {text.count(old)}")
    path.write_text(text.replace(old, new))
    for pyc in (path.parent / "__pycache__").glob(path.stem + ".*.pyc"):
        pyc.unlink()
    print(f"patch312: {rel}: {why}")


# 1. docarray: on 3.12 DocList[Doc] is a types.GenericAlias(_DocArrayTyped, Doc), and
#    typing._eval_type (string annotations: pydantic, get_type_hints) rebuilds such an alias as
#    origin[args], i.e. _DocArrayTyped[(Doc,)], which DocList refuses ("object is not
#    subscriptable"). Accept re-subscription of a typed DocList with its own doc type.
patch(
    "docarray/array/doc_list/doc_list.py",
    "        if cls.doc_type != AnyDoc:\n"
    "            raise TypeError(f'{cls} object is not subscriptable')\n",
    "        if cls.doc_type != AnyDoc:\n"
    "            # [patch312] py3.12 typing._eval_type re-subscripts GenericAlias(DocList[X], X)\n"
    "            _item = item[0] if isinstance(item, tuple) and len(item) == 1 else item\n"
    "            if _item is cls.doc_type:\n"
    "                return GenericAlias(cls, _item)  # type: ignore\n"
    "            raise TypeError(f'{cls} object is not subscriptable')\n",
    "DocList[X][(X,)] returns the same alias (py3.12 typing._eval_type)",
)
patch(
    "docarray/array/doc_list/doc_list.py",
    "from docarray.array.any_array import AnyDocArray\n",
    "from docarray.array.any_array import AnyDocArray\n"
    "from types import GenericAlias  # [patch312]\n",
    "import types.GenericAlias for patch 1",
)
EOF
