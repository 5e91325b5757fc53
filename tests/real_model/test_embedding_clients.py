"""Embeddings from the bundled all-MiniLM-L6-v2, through the clients that ask for them: the openai
SDK, LangChain's OpenAIEmbeddings and OllamaEmbeddings, the ollama library and Jina's gRPC client
all get the same vectors, which are sentence-transformers' within 1e-5, the same bits batched with
other requests as alone, and closer for a paraphrase than for an unrelated sentence."""
import asyncio

import numpy as np
import ollama
import openai
import pytest
from docarray import DocList

from schemas import EmbeddingDocument
from tests.conftest import embedding_model

MODEL = "all-MiniLM-L6-v2"
TEXTS = ["A man is eating food.", "A man eats something.", "The stock market fell sharply today."]


@pytest.fixture(scope="module")
def vectors(real_flow) -> np.ndarray:
    """The openai SDK's (base64 on the wire, its default)."""
    if not embedding_model():
        pytest.fail("the embedding model is absent: run `make model`")
    api = openai.OpenAI(base_url=f"http://127.0.0.1:{real_flow[1]}/v1", api_key="unused", max_retries=0)
    answer = api.embeddings.create(model=MODEL, input=TEXTS)
    assert answer.usage.prompt_tokens > len(TEXTS)
    return np.array([d.embedding for d in answer.data])


def test_vectors_are_sentence_transformers_and_a_paraphrase_is_closer(vectors):
    from sentence_transformers import SentenceTransformer
    expected = SentenceTransformer(embedding_model(), device="cpu").encode(TEXTS)
    assert vectors.shape == (3, 384) and np.abs(vectors - expected).max() < 1e-5
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-6)
    assert vectors[0] @ vectors[1] > 0.7 > 0.1 > vectors[0] @ vectors[2]


def test_every_client_gets_the_same_vectors(real_flow, vectors):
    from langchain_ollama import OllamaEmbeddings
    from langchain_openai import OpenAIEmbeddings
    base = f"http://127.0.0.1:{real_flow[1]}"
    client = ollama.Client(host=base)
    answers = {
        "ollama embed": client.embed(model=MODEL, input=TEXTS).embeddings,
        "ollama embeddings": [client.embeddings(model=MODEL, prompt=t).embedding for t in TEXTS],
        "OllamaEmbeddings": OllamaEmbeddings(base_url=base, model=MODEL).embed_documents(TEXTS),
        # OpenAI's own models are tokenized by tiktoken on the client: this one is not
        "OpenAIEmbeddings": OpenAIEmbeddings(base_url=f"{base}/v1", api_key="unused", model=MODEL,
                                             check_embedding_ctx_length=False).embed_documents(TEXTS)}
    for name, answer in answers.items():
        assert np.array_equal(np.array(answer), vectors), name
    assert "embedding" in client.show(MODEL).capabilities


def test_jina_grpc_documents_carry_their_embedding(real_flow, vectors):
    from jina import Client
    docs = Client(port=real_flow[0]).post("/embed", DocList[EmbeddingDocument]([EmbeddingDocument(text=t) for t in TEXTS]),
                                           return_type=DocList[EmbeddingDocument])
    assert np.array_equal(np.stack([d.embedding for d in docs]), vectors.astype(np.float32))


def test_batched_with_other_requests_equals_alone(real_flow, vectors):
    """Requests that arrive together share the encoder's passes (Jina's dynamic batching)."""
    api = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{real_flow[1]}/v1", api_key="unused", max_retries=0)
    others = [f"Sentence number {i} is about {'cats' if i % 2 else 'the weather in a city'}." for i in range(12)]

    async def together() -> list:
        return await asyncio.gather(*(api.embeddings.create(model=MODEL, input=[t, *others[i:i + 3]])
                                      for i, t in enumerate(TEXTS * 2)))
    for i, answer in enumerate(asyncio.run(together())):
        assert np.array_equal(np.array(answer.data[0].embedding), vectors[i % 3])


def test_an_input_too_long_is_refused_by_openai_and_cut_by_ollama(real_flow):
    long = "word " * 400
    api = openai.OpenAI(base_url=f"http://127.0.0.1:{real_flow[1]}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as refused:
        api.embeddings.create(model=MODEL, input=["short", long])
    assert refused.value.body["param"] == "input" and "input.1" in refused.value.body["message"]
    client = ollama.Client(host=f"http://127.0.0.1:{real_flow[1]}")
    cut = client.embed(model=MODEL, input=long)
    assert cut.prompt_eval_count == 256 and len(cut.embeddings[0]) == 384
    with pytest.raises(ollama.ResponseError) as refused:
        client.embed(model=MODEL, input=long, truncate=False)
    assert refused.value.status_code == 400
