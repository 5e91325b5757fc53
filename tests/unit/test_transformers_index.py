"""transformers' index of its model folders, kept on disk (engine/transformers_index.py): a fresh
interpreter that imports the engine and then transformers writes it; the next reads it and walks
no model folder; what it reads is what the walk makes; a torn file is walked again and replaced."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# in a fresh interpreter: the engine first (it installs the hook), then transformers and its models
PROBE = """
import json
import engine
import transformers, transformers.models
from transformers.utils import import_utils as iu
walk = iu.create_import_structure_from_path
models = transformers.__file__.replace("__init__.py", "models")
original = walk.__wrapped__
walked = original.cache_info().misses
print(json.dumps({"walked": walked, "hooked": walk is not original,
                  "same": walk(models) == original(models) and len(walk(models)) > 500,
                  "auto": transformers.AutoConfig.__name__}))
"""


def probe(cache: Path) -> dict:
    env = {**os.environ, "LLM_IMPORTS_CACHE": str(cache)}
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120, check=True)
    return json.loads(out.stdout.splitlines()[-1])


def test_the_index_is_walked_once_then_read(tmp_path):
    first = probe(tmp_path)
    assert first["hooked"] and first["same"] and first["auto"] == "AutoConfig"
    assert first["walked"] > 500, first  # every model folder, the first time
    kept = list(tmp_path.glob("transformers-models-*.pickle"))
    assert len(kept) == 1
    second = probe(tmp_path)
    assert second["walked"] == 0 and second["same"], second
    kept[0].write_bytes(kept[0].read_bytes()[:100])  # torn
    third = probe(tmp_path)
    assert third["walked"] > 500 and third["same"], third
    assert probe(tmp_path)["walked"] == 0


def test_a_cache_that_cannot_be_written_costs_only_the_walk(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    first = probe(blocked / "imports")
    assert first["hooked"] and first["same"] and first["walked"] > 500
