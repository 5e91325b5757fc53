"""docs/models.md's "What is served" tables say what the code serves: every GGUF type that
gguf_types.py keeps as blocks is listed, nothing else, with the kernel that runs it (declared in
kernels.h) and a test file that exists; every tiny architecture the tests build is listed, as
served and with its tests."""
import re

from engine.model.gguf_types import SERVED
from testing.toy_models import ARCHITECTURES

from ..conftest import ROOT

MODELS = (ROOT / "docs" / "models.md").read_text()
HEADER = (ROOT / "engine" / "kernels" / "kernels.h").read_text()


def _table(name: str) -> list[list[str]]:
    found = re.search(rf"<!-- served: {name} -->\n(.*?)<!-- /served -->", MODELS, re.S)
    assert found is not None, f"docs/models.md lost its {name} table"
    rows = [line.strip("|").split("|") for line in found.group(1).strip().splitlines()[2:]]
    return [[cell.strip() for cell in row] for row in rows]


def test_every_kept_gguf_type_is_listed_with_its_kernel_and_test():
    listed = []
    for types, _, kernel, test in _table("quant types"):
        listed += [t.strip() for t in types.split(",")]
        function = re.search(r"`(\w+)`", kernel)
        assert function is not None and f" {function.group(1)}(" in HEADER, f"{kernel}: no such kernel"
        for path in re.findall(r"`([\w/.]+\.py)`", test):
            assert (ROOT / path).exists(), path
    assert sorted(listed) == sorted(SERVED)


def test_every_tested_architecture_is_listed():
    names = {name.strip() for row in _table("architectures") for name in
             re.sub(r"\(.*?\)", "", row[0]).lower().replace(" ", "").replace("-", "").split(",")}
    for style in ARCHITECTURES:  # "gemma3_text" is "Gemma 3", "phi3" "Phi-3"
        assert style.removesuffix("_text") in names, f"docs/models.md: {style} is not in the architectures table"
    for row in _table("architectures"):
        tested = {style.removesuffix("_text") for style in ARCHITECTURES}
        if any(name in tested for name in re.sub(r"\(.*?\)", "", row[0]).lower().replace(" ", "").split(",")):
            assert "refused" not in row[1] and row[2], f"docs/models.md: {row[0]} is tested and served, not refused"
        for path in re.findall(r"`([\w/.]+\.py)`", row[2]):
            assert (ROOT / path).exists(), path
