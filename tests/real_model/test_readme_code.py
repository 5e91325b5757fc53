"""Every Python block of the README runs as a user would paste it into a file, against the
default model's Flow (its ports put where the README says 12345 and 12346), and prints an answer.
The console examples' commands are run by test_doc_examples.py, and the curl's body by
test_real_model.py."""
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT

BLOCKS = re.findall(r"^```python\n(.*?)^```", (ROOT / "README.md").read_text(), flags=re.S | re.M)


def test_the_readme_has_python_blocks():
    assert len(BLOCKS) >= 3, "the README's Python examples were not found"


@pytest.mark.parametrize("code", BLOCKS, ids=lambda code: code.split("\n")[0][:40])
def test_a_readme_python_block_runs_as_pasted(code, real_flow):
    """With the Flow's ports where the block writes 12345 and 12346, and in the variables that
    `make serve` and the client read (a block that names no port uses them)."""
    grpc_port, http_port = real_flow
    runnable = code.replace("12345", str(grpc_port)).replace("12346", str(http_port))
    env = {**os.environ, "LLM_GRPC_PORT": str(grpc_port), "LLM_HTTP_PORT": str(http_port)}
    run = subprocess.run([sys.executable, "-c", runnable], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=180)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip(), "the block printed no answer"
