"""The golden file's default model (testing/golden.py): a dozen chat questions answered greedily,
each token with its log probability and top-5 alternatives, bit for bit as the golden file holds
them, on every kernel path this CPU builds; and the README's greedy example is the golden
answer to its question."""
import re

import pytest

from testing import golden

README = golden.ROOT / "README.md"


@pytest.mark.parametrize("path", list(golden.kernel_paths()))
async def test_the_default_model_answers_as_the_golden_file_on_every_path(path, kernel_libraries, real_model,
                                                                           make_engine):
    await golden.check_path(path, kernel_libraries, make_engine, real_model, "SmolLM2-135M-Instruct",
                            golden.QUESTIONS, chat=True)


def test_the_readmes_greedy_answer_is_the_golden_one():
    """The README's greedy example (its question, the first golden one) begins the golden answer,
    which stops there: the answer every CPU gives."""
    shown = re.search(r"<!-- example: readme-greedy-answer -->\"(.*?)\"<!-- /example -->", README.read_text())
    assert shown is not None, "README.md lost its readme-greedy-answer example"
    [first] = [a for a in golden.expected("SmolLM2-135M-Instruct") if a["prompt"] == golden.QUESTIONS[0]]
    assert golden.QUESTIONS[0] in README.read_text()
    assert first["text"] == shown.group(1)
