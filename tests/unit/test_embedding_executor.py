"""The embedding executor loads its model on a thread of its own while it serves: a request waits
for the load, and one whose model failed to load is refused naming the model, while the executor
stays up. (The loaded model's answers: tests/real_model/test_embedding_clients.py.)"""
import threading

from docarray import DocList

from executors.embedding_executor import EmbeddingExecutor
from schemas import EmbeddingDocument


def test_a_model_that_does_not_load_refuses_each_request_naming_it(tmp_path):
    missing = str(tmp_path / "no-such-model")
    executor = EmbeddingExecutor(model=missing)
    [info] = executor.info(DocList[EmbeddingDocument]([EmbeddingDocument()]))
    assert info.error_field == "model" and f"the embedding model {missing} did not load" in info.error
    docs = executor.embed(DocList[EmbeddingDocument]([EmbeddingDocument(text="a"), EmbeddingDocument(text="b")]))
    assert [d.error_field for d in docs] == ["model", "model"] and all(missing in d.error for d in docs)
    assert all(d.embedding is None for d in docs)


def test_the_load_runs_on_its_own_thread_and_requests_wait_for_it(tmp_path, monkeypatch):
    """__init__ returns before the load ends (the executor serves meanwhile); `embedder` waits."""
    release = threading.Event()
    started = threading.Event()

    class SlowEmbedder:
        def __init__(self, source: str, threads: object) -> None:
            started.set()
            assert release.wait(30)
            raise OSError(f"{source} is unreadable")

    import engine
    monkeypatch.setattr(engine, "Embedder", SlowEmbedder, raising=False)
    executor = EmbeddingExecutor(model=str(tmp_path))
    assert started.wait(30) and not executor._loaded.is_set()
    answers: list = []
    reader = threading.Thread(target=lambda: answers.append(executor.info(DocList[EmbeddingDocument]([EmbeddingDocument()]))))
    reader.start()
    reader.join(0.3)
    assert reader.is_alive() and not answers  # waiting for the load
    release.set()
    reader.join(30)
    assert "unreadable" in answers[0][0].error


def test_no_model_refuses_as_not_found(monkeypatch):
    monkeypatch.setenv("LLM_EMBEDDING_MODEL", "")  # embeddings off
    executor = EmbeddingExecutor(model="")
    [info] = executor.info(DocList[EmbeddingDocument]([EmbeddingDocument()]))
    assert info.error_type == "not_found" and "no embedding model is served" in info.error
