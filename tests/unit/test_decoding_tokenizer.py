"""An engine process's tokenizer built for decoding (engine/model/decoding_tokenizer.py): from the
kept tokenizer.json without its merges, it decodes every id as the kept tokenizer does, refuses to
encode or be pickled until `with_merges`, and is then the kept tokenizer, its JSON byte for byte.
The engine's two encoders (reasoning markers, llguidance's vocabulary) ask for the merges first."""
import pickle
import random

import pytest

from contract import RequestLimits
from engine.model import decoding_tokenizer, gguf_file
from engine.model.decoding_tokenizer import DECODING, with_merges
from engine.policies.reasoning import ReasoningMarkers
from engine.policies.structured import GrammarCompiler

TEXTS = ["The capital of France is Paris.", "  two spaces,\ttabs\nand ünïcödé 日本語", "<|im_start|>user"]


@pytest.fixture
def kept(default_gguf, tmp_path, monkeypatch):
    """The default GGUF's kept folder, in a cache of this test's own."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    gguf_file.config_and_tokenizer(gguf_file.Path(default_gguf))
    folder = gguf_file.kept_tokenizer(default_gguf)
    assert folder is not None
    return folder


def test_a_kept_bpe_tokenizer_has_its_merges_left_out_beside_it(kept):
    import json
    full, decoding = (json.loads((kept / name).read_text()) for name in ("tokenizer.json", DECODING))
    assert full["model"]["merges"] and decoding["model"]["merges"] == []
    del full["model"]["merges"], decoding["model"]["merges"]
    assert full == decoding


def test_it_decodes_as_the_kept_tokenizer_and_encodes_only_with_its_merges(kept):
    full = gguf_file.saved_tokenizer(kept)
    decoding = gguf_file.saved_tokenizer(kept, decoding=True)
    assert decoding is not full and decoding.name_or_path == full.name_or_path == str(kept)
    backend, theirs = decoding.backend_tokenizer, full.backend_tokenizer
    size = theirs.get_vocab_size(with_added_tokens=True)
    assert [backend.id_to_token(i) for i in range(size)] == [theirs.id_to_token(i) for i in range(size)]
    assert decoding.all_special_ids == full.all_special_ids and len(decoding) == len(full)
    rng = random.Random(0)
    for _ in range(100):
        ids = [rng.randrange(size) for _ in range(rng.randrange(1, 30))]
        for skip in (False, True):
            assert decoding.decode(ids, skip_special_tokens=skip) == full.decode(ids, skip_special_tokens=skip)
    with pytest.raises(Exception, match="decodes only"):
        decoding.encode(TEXTS[0])
    with pytest.raises(Exception, match="cannot be serialized"):
        pickle.dumps(decoding)
    assert with_merges(decoding) is decoding
    assert [decoding.encode(t) for t in TEXTS] == [full.encode(t) for t in TEXTS]
    assert backend.to_str() == theirs.to_str()
    assert with_merges(full) is full  # any other tokenizer: as it is


def test_the_engines_encoders_ask_for_the_merges(kept):
    full = gguf_file.saved_tokenizer(kept)
    decoding = gguf_file.saved_tokenizer(kept, decoding=True)
    assert ReasoningMarkers.of(decoding, "<|im_start|>,<|im_end|>") == ReasoningMarkers.of(full, "<|im_start|>,<|im_end|>")
    assert decoding.encode(TEXTS[0]) == full.encode(TEXTS[0])
    decoding = gguf_file.saved_tokenizer(kept, decoding=True)
    with pytest.raises(Exception, match="decodes only"):
        decoding.backend_tokenizer.encode(TEXTS[0])
    grammars = GrammarCompiler(decoding, RequestLimits())
    assert grammars.tokenizer is not None, grammars.unavailable


def test_a_folder_kept_before_gets_its_merges_apart_at_its_next_decoding_load(kept):
    (kept / DECODING).unlink()
    first = gguf_file.saved_tokenizer(kept, decoding=True)
    first.encode(TEXTS[0])  # built whole: nothing to leave out yet
    assert (kept / DECODING).exists()
    with pytest.raises(Exception, match="decodes only"):
        gguf_file.saved_tokenizer(kept, decoding=True).encode(TEXTS[0])


def test_a_tokenizer_without_merges_writes_no_decoding_file_and_is_looked_at_once(kept, monkeypatch):
    import json
    spec = json.loads((kept / "tokenizer.json").read_text())
    spec["model"]["merges"] = []
    (kept / "tokenizer.json").write_text(json.dumps(spec))
    (kept / DECODING).unlink()
    decoding_tokenizer.write(kept)
    assert not (kept / DECODING).exists() and decoding_tokenizer.written(kept)
    monkeypatch.setattr(decoding_tokenizer, "write", lambda folder: pytest.fail("its JSON read again"))
    assert gguf_file.saved_tokenizer(kept, decoding=True).encode(TEXTS[0])  # the full one: it encodes
