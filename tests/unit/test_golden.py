"""The golden file's tiny model (testing/golden.py): every kernel path this CPU builds gives the
greedy tokens, log probabilities and top-5 alternatives that the golden file holds, bit for bit,
batched with one another as they are."""
import pytest

from testing import golden


@pytest.mark.parametrize("path", list(golden.kernel_paths()))
async def test_the_tiny_model_answers_as_the_golden_file_on_every_path(path, kernel_libraries, golden_llama,
                                                                        make_engine):
    await golden.check_path(path, kernel_libraries, make_engine, golden_llama, "tiny-llama", golden.PROMPTS,
                            chat=False)
