"""A GGUF's tokenizer, kept in the cache, loads as the tokenizers library's pipeline
(gguf_file.saved_tokenizer) and behaves as transformers' class for the architecture does: the
same ids for every text, the same texts for every id, the same special tokens and chat
template, for the default model's Q4_1 file and Gemma 3's 262,144-token vocabulary."""
import pickle
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from engine.model.gguf_file import config_and_tokenizer, metadata_cache, saved_tokenizer
from testing.toy_models import corpus

TEXTS = corpus(200, seed=11) + [
    "", " ", "  two spaces", "tabs\tand\nnew\n\nlines\r\n", "日本語のテキスト", "émoji 🎉🚀 and ZWJ 👩‍👩‍👧",
    "<|im_start|>user\nhi<|im_end|>\n", "<start_of_turn>user\nhi<end_of_turn>\n<bos><eos><pad>",
    "def f(x):\n    return x ** 2  # code", "1234567890 3.14159 -0.5e-10", "a" * 300, "\u00a0\u2028\u200b",
]


@pytest.fixture(params=["default_gguf", "gguf_model"])
def cached(request) -> Path:
    path = Path(request.getfixturevalue(request.param))  # each file's own fixture: one absent skips only its own
    config_and_tokenizer(path)  # the cache entry, made once
    folder = metadata_cache(path)
    assert folder is not None and (folder / "tokenizer.json").exists()
    return folder


def test_the_saved_tokenizer_is_the_classs(cached):
    fast, reference = saved_tokenizer(cached), AutoTokenizer.from_pretrained(cached)
    assert len(fast) == len(reference) and fast.get_vocab() == reference.get_vocab()
    assert fast.all_special_ids == reference.all_special_ids and fast.all_special_tokens == reference.all_special_tokens
    assert (fast.bos_token_id, fast.eos_token_id, fast.pad_token_id, fast.unk_token_id) == \
        (reference.bos_token_id, reference.eos_token_id, reference.pad_token_id, reference.unk_token_id)
    assert fast.added_tokens_decoder == reference.added_tokens_decoder
    assert fast.chat_template == reference.chat_template
    for special in (True, False):
        assert [fast(t, add_special_tokens=special).input_ids for t in TEXTS] == \
            [reference(t, add_special_tokens=special).input_ids for t in TEXTS]
    ids = [reference(t).input_ids for t in TEXTS] + [list(range(0, len(reference), 97))]
    for skip in (True, False):
        assert [fast.decode(i, skip_special_tokens=skip) for i in ids] == \
            [reference.decode(i, skip_special_tokens=skip) for i in ids]
    assert [fast.convert_ids_to_tokens(i) for i in ids] == [reference.convert_ids_to_tokens(i) for i in ids]
    if reference.chat_template:
        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
        assert fast.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == \
            reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    again = pickle.loads(pickle.dumps(fast))  # as the engine process sends it to the executor's
    assert [again(t).input_ids for t in TEXTS] == [fast(t).input_ids for t in TEXTS]


def test_a_setting_it_does_not_know_leaves_the_folder_to_autotokenizer(cached, tmp_path):
    folder = tmp_path / "entry"
    folder.mkdir()
    for name in ("tokenizer.json", "chat_template.jinja"):
        if (cached / name).exists():
            (folder / name).write_bytes((cached / name).read_bytes())
    config = (cached / "tokenizer_config.json").read_text()
    (folder / "tokenizer_config.json").write_text(config.replace("{", '{"padding_side": "left",', 1))
    assert saved_tokenizer(folder).padding_side == "left"
    assert type(saved_tokenizer(cached)).__name__ == "TokenizersBackend"
