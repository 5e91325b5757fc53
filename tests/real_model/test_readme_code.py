"""Every Python block of the README and of the guides that show code runs as a user would paste it
into a file, against the default model's Flow (its ports put where the documents say 12345 and
12346), and prints an answer. A block that begins indented is an excerpt of a class (DEVELOPING.md's
request field), not a program, and is the one kind left out. The console examples' commands are run
by test_doc_examples.py, the shell lines by tests/service/test_readme_commands.py, and the README's
curl body by test_real_model.py."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

DOCUMENTS = ("README.md", "docs/clients.md", "docs/api.md", "docs/DEVELOPING.md")
# packages whose pins clash with Jina's live in the clients' venv (`make test` builds it)
CLIENTS_ONLY = ("anthropic",)


def python_blocks(document: str) -> list[str]:
    return [block for block in re.findall(r"^```python\n(.*?)^```", (ROOT / document).read_text(), flags=re.S | re.M)
            if not block.startswith((" ", "\t"))]


BLOCKS = [(document, block) for document in DOCUMENTS for block in python_blocks(document)]


def test_the_documents_have_python_blocks():
    found = {document: len(python_blocks(document)) for document in DOCUMENTS}
    assert found["README.md"] >= 1 and found["docs/clients.md"] >= 5, found
    pages = ["README.md", *(str(page.relative_to(ROOT)) for page in sorted((ROOT / "docs").glob("*.md")))]
    assert [page for page in pages if python_blocks(page)] == [page for page in pages if page in DOCUMENTS]


def interpreter(code: str) -> str:
    """The project's Python, or the clients' venv's for a block that imports what only it has."""
    if not re.search(rf"^(from|import) ({'|'.join(CLIENTS_ONLY)})\b", code, flags=re.M):
        return sys.executable
    python = os.environ.get("LLM_CLIENTS_PYTHON") or str(ROOT / ".venv-clients" / "bin" / "python")
    if not Path(python).exists():
        pytest.skip(f"{python} is absent (make test builds it): the blocks that import {CLIENTS_ONLY} need it")
    return python


@pytest.mark.parametrize("document,code", BLOCKS, ids=[f"{d}:{i}" for i, (d, _) in enumerate(BLOCKS)])
def test_the_python_block_runs_as_pasted(document, code, real_flow):
    """The block in a process of its own, with the Flow's ports where it writes 12345 and 12346,
    and in the variables that `make serve` and the client read (a block that names no port uses
    them)."""
    grpc_port, http_port = real_flow
    env = {**os.environ, "LLM_GRPC_PORT": str(grpc_port), "LLM_HTTP_PORT": str(http_port)}
    python = interpreter(code)
    code = code.replace("12345", str(grpc_port)).replace("12346", str(http_port))
    done = subprocess.run([python, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    first = f"{document}: the block that starts {code.splitlines()[0]!r}"
    assert done.returncode == 0, (first, done.stderr[-3000:])
    assert done.stdout.strip(), f"{first} printed no answer"
