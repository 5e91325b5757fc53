"""The golden file's default model (testing/golden.py): a dozen chat questions answered greedily,
each token with its log probability and top-5 alternatives, bit for bit as the golden file holds
them, on every kernel path this CPU builds; and the README's greedy example is the golden
answer to its question."""
import json
import re

import pytest

from testing import doc_examples, golden

README = golden.ROOT / "README.md"


@pytest.mark.parametrize("path", list(golden.kernel_paths()))
async def test_the_default_model_answers_as_the_golden_file_on_every_path(path, kernel_libraries, real_model,
                                                                           make_engine):
    await golden.check_path(path, kernel_libraries, make_engine, real_model, "SmolLM2-135M-Instruct",
                            golden.QUESTIONS, chat=True)


def test_the_readmes_greedy_answer_is_the_golden_one():
    """The README's first request (its question, the first golden one) is greedy, and the answer
    its example shows is the golden answer, which stops there: the answer every CPU gives."""
    text = README.read_text()
    body = json.loads(re.search(r"-d '(\{.*?\})'", text.split("README-CURL-BODY")[1]).group(1))
    assert body["temperature"] == 0 and body["messages"] == [{"role": "user", "content": golden.QUESTIONS[0]}]
    shown = doc_examples.examples()["readme-chat-completion"]
    assert shown.document == "README.md", "README.md lost its readme-chat-completion example"
    [choice] = json.loads(shown.content())["choices"]
    [first] = [a for a in golden.expected("SmolLM2-135M-Instruct") if a["prompt"] == golden.QUESTIONS[0]]
    assert choice["message"]["content"] == first["text"] and choice["finish_reason"] == "stop"
