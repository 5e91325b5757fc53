"""A GGUF file's config and tokenizer are kept once per metadata, wherever the file lies: copies
of one file (each test run extracts its own) share one cache entry instead of adding one each."""
import shutil
from pathlib import Path

import gguf
import numpy as np

from engine.model.gguf_file import metadata_cache, read


def write(path: Path, name: str, tokens: list[str], weights: np.ndarray) -> Path:
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name(name)
    writer.add_token_list(tokens)
    writer.add_tensor("blk.0.ffn_down.weight", weights)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_copies_share_an_entry_and_other_metadata_gets_its_own(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    weights = np.ones((4, 8), dtype=np.float32)
    for folder in ("copy", "weights", "vocabulary"):
        (tmp_path / folder).mkdir()
    first = write(tmp_path / "model.gguf", "tiny", ["a", "b", "c"], weights)
    copied = Path(shutil.copy(first, tmp_path / "copy" / "model.gguf"))
    other_weights = write(tmp_path / "weights" / "model.gguf", "tiny", ["a", "b", "c"], weights * 2)
    other_vocabulary = write(tmp_path / "vocabulary" / "model.gguf", "tiny", ["a", "b", "d"], weights)
    entry = metadata_cache(first)
    assert entry is not None and entry.parent == tmp_path / "cache" / "llm-stream" / "gguf"
    assert metadata_cache(copied) == entry
    assert metadata_cache(other_weights) == entry  # its tensors make no other config or tokenizer
    assert metadata_cache(other_vocabulary) != entry


def test_a_read_header_gives_the_same_entry_without_a_second_walk(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    path = write(tmp_path / "model.gguf", "tiny", ["a", "b", "c"], np.ones((4, 8), dtype=np.float32))
    header = read(path)
    assert metadata_cache(path, header.metadata_end) == metadata_cache(path)
    assert metadata_cache(path, header.metadata_end - 1) != metadata_cache(path)  # the bytes it hashes


def test_a_file_unchanged_is_walked_once_per_process(tmp_path, monkeypatch):
    """The executor asks where a file's tokenizer is kept at every reload: its header is walked
    once, and again only after the file changes."""
    from engine.model import gguf_file
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    path = write(tmp_path / "model.gguf", "tiny", ["a", "b", "c"], np.ones((4, 8), dtype=np.float32))
    walks = []
    real = gguf_file._fields
    monkeypatch.setattr(gguf_file, "_fields", lambda f, p: walks.append(p) or real(f, p))
    first = metadata_cache(path)
    assert metadata_cache(path) == first and len(walks) == 1
    write(path, "other", ["a", "b", "c"], np.ones((4, 8), dtype=np.float32))
    assert metadata_cache(path) != first and len(walks) == 2
