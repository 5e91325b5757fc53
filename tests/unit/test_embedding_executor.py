"""The embedding executor loads its model at the first embedding request: before that, the model is
described from its folder; the requests that come during the load wait for that one load; a load
that fails refuses them naming the model, and the next request tries again. (The loaded model's
answers: tests/real_model/test_embedding_clients.py.)"""
import json
import threading
from dataclasses import replace
from pathlib import Path

import pytest
from docarray import DocList

from engine.embedder_info import describe_embedder
from executors.embedding_executor import DEFAULT_MODEL, EmbeddingExecutor
from schemas import EmbeddingDocument
from tests.conftest import ROOT

BUNDLED = ROOT / DEFAULT_MODEL


def one(text: str = "") -> DocList[EmbeddingDocument]:
    return DocList[EmbeddingDocument]([EmbeddingDocument(text=text)])


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A model folder as sentence-transformers writes one, its config files alone."""
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8, "model_type": "bert"}))
    (tmp_path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 16}))
    (tmp_path / "modules.json").write_text(json.dumps([{"type": "sentence_transformers.models.Normalize"}]))
    return tmp_path


def test_a_folder_that_is_no_model_refuses_each_request_naming_it(tmp_path):
    missing = str(tmp_path / "no-such-model")
    executor = EmbeddingExecutor(model=missing)
    [info] = executor.info(one())
    assert info.error_field == "model" and f"the embedding model {missing} did not load" in info.error
    docs = executor.embed(DocList[EmbeddingDocument]([EmbeddingDocument(text="a"), EmbeddingDocument(text="b")]))
    assert [d.error_field for d in docs] == ["model", "model"] and all(missing in d.error for d in docs)
    assert all(d.embedding is None for d in docs)


def test_the_model_is_described_from_its_folder_and_loads_at_the_first_embedding(folder, monkeypatch):
    """No load at the start nor for the listing; the requests during the load wait for that one load;
    a failed load refuses them naming the model, and the next request loads again."""
    release, loads = threading.Event(), []

    class SlowEmbedder:
        def __init__(self, source: str, threads: object) -> None:
            loads.append(source)
            assert release.wait(30)
            raise OSError(f"{source} is unreadable")

    import engine
    monkeypatch.setattr(engine, "Embedder", SlowEmbedder, raising=False)
    executor = EmbeddingExecutor(model=str(folder))
    [info] = executor.info(one())
    assert json.loads(info.text)["dimensions"] == 8 and json.loads(info.text)["normalized"] is True
    assert loads == []
    answers: list = []
    requests = [threading.Thread(target=lambda: answers.append(executor.embed(one("hello")))) for _ in range(3)]
    for request in requests:
        request.start()
    for request in requests:
        request.join(0.3)
    assert all(request.is_alive() for request in requests) and not answers  # waiting for the load
    release.set()
    for request in requests:
        request.join(30)
    assert loads == [str(folder)]  # one load for the three
    assert all("unreadable" in answer[0].error and answer[0].error_field == "model" for answer in answers)
    executor.embed(one("again"))
    assert loads == [str(folder)] * 2  # the next request tries again


def test_no_model_refuses_as_not_found(monkeypatch):
    monkeypatch.setenv("LLM_EMBEDDING_MODEL", "")  # embeddings off
    executor = EmbeddingExecutor(model="")
    [info] = executor.info(one())
    assert info.error_type == "not_found" and "no embedding model is served" in info.error


@pytest.mark.skipif(not (BUNDLED / "config.json").exists(), reason="`make model` fetches the bundled model")
def test_the_folder_says_what_the_loaded_model_says():
    from engine import Embedder
    loaded = Embedder(str(BUNDLED)).info
    assert loaded.load_seconds > 0 and loaded.parameters > 20_000_000
    assert describe_embedder(str(BUNDLED)) == replace(loaded, load_seconds=0.0)
