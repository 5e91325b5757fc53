"""TGI-compatible routes in the real Flow: huggingface_hub's InferenceClient, curl and requests."""
import pytest
import requests
from huggingface_hub import InferenceClient

from client import generate, stream
from engine.model.loader import pick_device
from tests.gateway_helpers import curl_sse


@pytest.fixture(scope="module")
def hf(flow) -> InferenceClient:
    _, http_port = flow
    return InferenceClient(f"http://127.0.0.1:{http_port}")


async def test_inference_client_stream_with_details(flow, hf):
    grpc_port, _ = flow
    ref = await generate("a lazy dog", port=grpc_port, max_tokens=12)
    events = list(hf.text_generation("a lazy dog", max_new_tokens=12, stream=True, details=True))
    assert len(events) == 12  # one event per token, even when a document covered several
    assert [e.index for e in events] == list(range(1, 13))
    assert [e.generated_text for e in events[:-1]] == [None] * 11
    final = events[-1]
    assert final.generated_text == ref.generated_text
    assert "".join(e.token.text for e in events if not e.token.special) == final.generated_text
    ref_ids = [t async for d in stream("a lazy dog", port=grpc_port, max_tokens=12) for t in d.token_ids]
    assert [e.token.id for e in events] == ref_ids
    assert final.details.finish_reason == "length" and final.details.generated_tokens == 12
    assert final.details.input_length == ref.prompt_tokens and final.details.seed is None
    # without details: plain token texts
    texts = list(hf.text_generation("a lazy dog", max_new_tokens=12, stream=True))
    assert "".join(texts) == ref.generated_text


async def test_inference_client_non_stream(flow, hf):
    grpc_port, _ = flow
    ref = await generate("a lazy dog", port=grpc_port, max_tokens=12)
    assert hf.text_generation("a lazy dog", max_new_tokens=12) == ref.generated_text
    out = hf.text_generation("a lazy dog", max_new_tokens=12, details=True)
    assert out.generated_text == ref.generated_text
    assert out.details.finish_reason == "length" and out.details.generated_tokens == 12
    assert len(out.details.tokens) == 12
    assert "".join(t.text for t in out.details.tokens if not t.special) == ref.generated_text
    # sampling with a seed repeats, and the seed is reported
    a = hf.text_generation("a lazy dog", max_new_tokens=8, do_sample=True, seed=11, details=True)
    b = hf.text_generation("a lazy dog", max_new_tokens=8, temperature=0.7, seed=11, details=True)
    assert a.details.seed == 11 and b.details.seed == 11
    c = hf.text_generation("a lazy dog", max_new_tokens=8, do_sample=True, seed=11)
    assert c == a.generated_text


def test_curl_generate_stream_as_in_tgi_docs(flow):
    _, http_port = flow
    events = curl_sse(f"http://127.0.0.1:{http_port}/generate_stream",
                      {"inputs": "What is Deep Learning?", "parameters": {"max_new_tokens": 20}})
    assert len(events) == 20
    assert all(set(e["token"]) == {"id", "text", "logprob", "special"} for e in events)
    assert events[-1]["generated_text"] == "".join(e["token"]["text"] for e in events)
    assert events[-1]["details"] is None  # details were not asked for


def test_generate_and_compat_root(flow):
    _, http_port = flow
    base = f"http://127.0.0.1:{http_port}"
    body = {"inputs": "streams of tokens", "parameters": {"max_new_tokens": 7, "details": True}}
    one = requests.post(f"{base}/generate", json=body, timeout=60).json()
    assert one["details"]["generated_tokens"] == 7 and one["details"]["finish_reason"] == "length"
    root = requests.post(f"{base}/", json=body, timeout=60).json()  # TGI's compat route: a list
    assert root[0]["generated_text"] == one["generated_text"]
    full = requests.post(f"{base}/generate", json={"inputs": "streams of tokens", "parameters": {
        "max_new_tokens": 7, "return_full_text": True}}, timeout=60).json()
    assert full["generated_text"] == "streams of tokens" + one["generated_text"]
    streamed = curl_sse(f"{base}/", {**body, "stream": True})
    assert streamed[-1]["generated_text"] == one["generated_text"]
    assert streamed[-1]["details"]["generated_tokens"] == 7


@pytest.mark.parametrize("body,field", [
    ({"inputs": "", "parameters": {"max_new_tokens": 4}}, "inputs"),
    ({"inputs": "hi", "parameters": {"max_new_tokens": 0}}, "max_new_tokens"),
    ({"inputs": "hi", "parameters": {"max_new_tokens": "lots"}}, "max_new_tokens"),
    ({"inputs": "hi", "parameters": {"top_p": 2.0}}, "top_p"),
    ({"parameters": {}}, "inputs"),
    ({"inputs": "hi", "parameters": {"max_new_tokens": True}}, "max_new_tokens"),  # no coercion
    ({"inputs": "hi", "parameters": {"temperature": "0.5", "do_sample": True}}, "temperature"),
])
def test_validation_errors_are_422(flow, body, field):
    _, http_port = flow
    for route in ("/generate", "/generate_stream", "/"):
        r = requests.post(f"http://127.0.0.1:{http_port}{route}", json=body, timeout=60)
        assert r.status_code == 422, (route, r.text)
        assert r.json()["error_type"] == "validation" and field in r.json()["error"]


def test_inference_client_raises_on_validation_error(hf):
    from huggingface_hub.errors import ValidationError
    with pytest.raises(ValidationError, match="top_p"):
        hf.text_generation("hello", max_new_tokens=4, top_p=3.0)
    with pytest.raises(ValidationError, match="top_p"):
        list(hf.text_generation("hello", max_new_tokens=4, top_p=3.0, stream=True))


def test_info_and_health(flow, gpt2_model):
    _, http_port = flow
    info = requests.get(f"http://127.0.0.1:{http_port}/info", timeout=30).json()
    assert info["model_id"] == "gpt2" and info["max_total_tokens"] == 512
    assert info["kv_block_size"] == 16 and info["prefix_caching"] is True
    assert info["kv_cache_dtype"] == ("float32" if pick_device(None).type == "cpu" else info["model_dtype"])  # not int4
    assert 0 < info["kv_cache_tokens"] == info["max_batch_total_tokens"] and info["kv_cache_tokens"] % 16 == 0
    assert info["kv_window_tokens"] == 0  # the default model has no sliding-window layers
    assert info["model_device_type"] == pick_device(None).type  # cuda where there is a GPU
    assert requests.get(f"http://127.0.0.1:{http_port}/health", timeout=30).status_code == 200
    # Jina's own health check (GET /) is still there, next to TGI's POST /
    assert requests.get(f"http://127.0.0.1:{http_port}/", timeout=30).status_code == 200


def test_coalesced_document_becomes_one_event_per_token():
    from gateway.protocols.tgi_routes import token_events
    from schemas import ModelOutputDocument
    doc = ModelOutputDocument(token_id=9, token_ids=[7, 8, 9], text="abc", texts=["a", "", "bc"], index=5,
                              logprobs=[-1.0, -2.0, -3.0], logprob=-3.0, special=False,
                              specials=[False, True, False])
    events = token_events(doc)
    assert [e["index"] for e in events] == [4, 5, 6]  # TGI counts from 1
    assert [e["token"]["id"] for e in events] == [7, 8, 9]
    assert [e["token"]["special"] for e in events] == [False, True, False]
    assert [e["token"]["text"] for e in events] == ["a", "", "bc"]  # each token keeps its own text
    assert [e["token"]["logprob"] for e in events] == [-1.0, -2.0, -3.0]
