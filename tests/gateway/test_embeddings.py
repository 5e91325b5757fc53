"""The embedding routes against a scripted embedder: OpenAI's and Ollama's requests onto one
DocList of inputs in order, the vectors back in each API's shape (base64 as the openai SDK asks),
and what is not served refused naming the field, before anything is embedded."""
import base64

import numpy as np
import pytest

MODEL = "fake-embedder"


def test_openai_embeddings_one_per_input_in_order(http, fake):
    r = http.post("/v1/embeddings", json={"model": MODEL, "input": ["a", "bbb", ""], "user": "u"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert [d["index"] for d in body["data"]] == [0, 1, 2] and body["model"] == MODEL
    assert [d["embedding"] for d in body["data"]] == [[1, 1, 0], [3, 1, 0], [0, 1, 0]]
    assert body["usage"] == {"prompt_tokens": 4, "total_tokens": 4}
    assert [d.truncate for d in fake.sent] == [False] * 3  # OpenAI refuses an input too long


def test_openai_token_ids_and_base64(http, fake):
    r = http.post("/v1/embeddings", json={"model": MODEL, "input": [[5, 6], [7]], "encoding_format": "base64"})
    vectors = [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4").tolist() for d in r.json()["data"]]
    assert vectors == [[2, 1, 0], [1, 1, 0]] and [d.token_ids for d in fake.sent] == [[5, 6], [7]]
    r = http.post("/v1/embeddings", json={"model": MODEL, "input": [1, 2, 3]})  # one input of token ids
    assert [d["embedding"] for d in r.json()["data"]] == [[3, 1, 0]]


def test_ollama_embed_and_the_older_embeddings(http, fake):
    r = http.post("/api/embed", json={"model": f"{MODEL}:latest", "input": ["ab", "c"], "keep_alive": "5m",
                                      "options": {"temperature": None}})
    assert r.status_code == 200, r.text
    assert r.json()["embeddings"] == [[2, 1, 0], [1, 1, 0]] and r.json()["prompt_eval_count"] == 3
    assert [d.truncate for d in fake.sent] == [True, True]  # Ollama cuts a long input by default
    assert http.post("/api/embed", json={"model": MODEL, "input": "x", "truncate": False}).status_code == 200
    assert fake.sent[-1].truncate is False
    assert http.post("/api/embeddings", json={"model": MODEL, "prompt": "abcd"}).json() == {"embedding": [4, 1, 0]}


@pytest.mark.parametrize("path,body,status,field", [
    ("/v1/embeddings", {"model": "text-embedding-3-small", "input": "x"}, 404, "model"),
    ("/v1/embeddings", {"input": "x"}, 400, "model"),
    ("/v1/embeddings", {"model": MODEL, "input": "x", "dimensions": 2}, 400, "dimensions"),
    ("/v1/embeddings", {"model": MODEL, "input": "x", "encoding_format": "int8"}, 400, "encoding_format"),
    ("/v1/embeddings", {"model": MODEL, "input": []}, 400, "input"),
    ("/v1/embeddings", {"model": MODEL, "input": ["x"] * 2049}, 400, "input"),
    ("/v1/embeddings", {"model": MODEL, "input": "x", "bogus": 1}, 400, "bogus"),
    ("/v1/embeddings", {"model": MODEL, "input": 3}, 400, "input"),
    ("/api/embed", {"model": "nomic-embed-text", "input": "x"}, 404, "model"),
    ("/api/embed", {"model": MODEL, "input": "x", "options": {"num_ctx": 8}}, 400, "options.num_ctx"),
    ("/api/embed", {"model": MODEL, "input": "x", "dimensions": 2}, 400, "dimensions"),
    ("/api/embeddings", {"model": MODEL, "prompt": "x", "truncate": True}, 400, "truncate")])
def test_what_is_not_served_is_refused_naming_the_field(http, fake, path, body, status, field):
    r = http.post(path, json=body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    message = error["message"] if isinstance(error, dict) else error
    assert message.startswith(field) or f"'{body.get('model')}'" in message, message
    assert not fake.sent


def test_a_refused_input_refuses_the_request_and_no_embedder_is_404(http, fake):
    async def refusing(docs):
        return [docs[0].model_copy(update={"error": "input.0: 300 tokens, more than the model's 256",
                                           "error_type": "validation", "error_field": "input"})]
    fake.embed = refusing
    r = http.post("/v1/embeddings", json={"model": MODEL, "input": "long"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input"
    fake.embedding = None
    r = http.post("/api/embed", json={"model": MODEL, "input": "x"})
    assert r.status_code == 404 and "no embedding model" in r.json()["error"]


def test_v1_models_lists_the_embedding_model_too(http, fake):
    cards = http.get("/v1/models").json()["data"]
    assert [(c["id"], c["max_model_len"]) for c in cards] == [("fake-model", 512), (MODEL, 16)]
    assert http.get(f"/v1/models/{MODEL}").json()["id"] == MODEL
    fake.embedding = None
    assert [c["id"] for c in http.get("/v1/models").json()["data"]] == ["fake-model"]
    assert http.get(f"/v1/models/{MODEL}").status_code == 404


def test_the_embedding_model_is_listed_unloaded_until_its_first_embedding(http, fake):
    """It loads at the first embedding request (executors/embedding_executor.py): until then its
    description says no load (`load_seconds` 0), and the listings say so."""
    fake.embedding = {**fake.embedding, "load_seconds": 0.0}
    states = {c["id"]: c["state"] for c in http.get("/v1/models").json()["data"]}
    assert states[MODEL] == "unloaded"
    assert [m["name"] for m in http.get("/api/ps").json()["models"]] == ["fake-model:latest"]
    fake.embedding = {**fake.embedding, "load_seconds": 2.5}  # it has embedded: asked again, live
    assert {c["id"]: c["state"] for c in http.get("/v1/models").json()["data"]}[MODEL] == "loaded"
    running = {m["name"]: m for m in http.get("/api/ps").json()["models"]}
    assert running[f"{MODEL}:latest"]["load_duration"] == 2_500_000_000
