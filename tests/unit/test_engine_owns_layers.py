"""transformers is read, never patched: the engine runs its own C stack (c_stack.py) or
transformers' modules as they are, with the engine's own product layers put in their place
through one function (placement.put)."""
import ast
from pathlib import Path

import pytest
from torch import nn

from contract import EngineConfig
from engine.model.loader import load_model
from tests.unit.test_int4 import four_bit_llama  # noqa: F401 - a fixture

ROOT = Path(__file__).resolve().parents[2]
PLACEMENT = ROOT / "engine" / "model" / "placement.py"
# the one module that replaces a function of transformers, and that function is of its imports, not
# of any model: the index of which names its model folders export, read from a file instead of made
# from their sources (the same index; tests/unit/test_transformers_index.py)
IMPORT_INDEX = ROOT / "engine" / "transformers_index.py"


def _offences(source: str, placement: bool = False) -> list[str]:
    """Each way of changing another module's behaviour that the source uses: an assigned `forward`
    or `__class__`, setattr, or a child registered (except in placement.py)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        found += [f"assigns .{t.attr}" for t in targets if isinstance(t, ast.Attribute)
                  and t.attr in ("forward", "__class__")]
        if isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else \
                node.func.attr if isinstance(node.func, ast.Attribute) else ""
            if name == "setattr" or (name in ("register_module", "add_module") and not placement):
                found.append(f"calls {name}")
    return found


def test_no_module_of_the_engine_patches_another_modules_behaviour():
    offences = [f"{path.relative_to(ROOT)} {o}" for path in sorted((ROOT / "engine").rglob("*.py"))
                if path != IMPORT_INDEX for o in _offences(path.read_text(), path == PLACEMENT)]
    assert not offences, offences
    source = IMPORT_INDEX.read_text()
    assert _offences(source) == ["calls setattr"] and 'WALK = "create_import_structure_from_path"' in source
    assert source.count("setattr(module, WALK,") == 1


def test_the_scan_finds_each_kind_of_patch():
    """The scan above is not blind: each way it names is found, and only placement.py registers."""
    patched = "layer.forward = f\nm.__class__ = C\nsetattr(m, 'x', 1)\nparent.add_module('a', b)\n"
    assert len(_offences(patched)) == 4 and len(_offences(patched, placement=True)) == 3


@pytest.mark.parametrize("fixture", ["four_bit_llama", "gpt2_model"])
def test_a_loaded_model_keeps_transformers_classes_and_forwards(fixture, request):
    """Every module of a loaded model is transformers' or torch's as built, or one of the engine's
    own layers put in a child's place; no instance carries a forward of its own."""
    loaded = load_model(EngineConfig(model=request.getfixturevalue(fixture), device="cpu"))
    engine_layers = 0
    for name, module in loaded.model.named_modules():
        origin = type(module).__module__
        assert origin.startswith(("transformers.", "torch.", "engine.")), (name, origin)
        assert "forward" not in vars(module), name
        engine_layers += origin.startswith("engine.")
    assert engine_layers and isinstance(loaded.model, nn.Module)
