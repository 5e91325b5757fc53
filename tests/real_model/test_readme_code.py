"""Every Python block of the README runs as a user would paste it into a file, against the
default model's Flow (its ports put where the README says 12345 and 12346), and prints an answer.
The console examples' commands are run by test_doc_examples.py, and the curl's body by
test_real_model.py."""
import os
import re
import subprocess
import sys

from tests.conftest import ROOT

BLOCKS = re.findall(r"^```python\n(.*?)^```", (ROOT / "README.md").read_text(), flags=re.S | re.M)


def test_the_readme_has_python_blocks():
    assert len(BLOCKS) >= 3, "the README's Python examples were not found"


def test_the_readme_python_blocks_run_as_pasted(real_flow):
    """Each block in a process of its own, side by side (each spends seconds importing its
    client), with the Flow's ports where the block writes 12345 and 12346, and in the variables
    that `make serve` and the client read (a block that names no port uses them)."""
    grpc_port, http_port = real_flow
    env = {**os.environ, "LLM_GRPC_PORT": str(grpc_port), "LLM_HTTP_PORT": str(http_port)}
    runs = [subprocess.Popen([sys.executable, "-c", code.replace("12345", str(grpc_port)).replace("12346", str(http_port))],
                             cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for code in BLOCKS]
    for code, run in zip(BLOCKS, runs, strict=True):
        out, err = run.communicate(timeout=180)
        assert run.returncode == 0, (code.splitlines()[0], err[-3000:])
        assert out.strip(), f"the block that starts {code.splitlines()[0]!r} printed no answer"
