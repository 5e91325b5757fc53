"""Log probabilities in OpenAI's and TGI's shapes, from the documents' per-token lists: each
chunk carries its own tokens' numbers, and the chunks join to the whole answer's."""
import pytest

from schemas import ModelOutputDocument
from tests.gateway_helpers import sse_data

CHAT = {"messages": [{"role": "user", "content": "hi"}]}
TOKENS = [(" Paris", -0.25, [(" Paris", -0.25), (" the", -2.5)]), (".", -0.5, [(".", -0.5), (",", -1.5)]),
          ("é", -1.0, [("é", -1.0), ("e", -3.0)])]


def docs(chunking: list[int]) -> list[ModelOutputDocument]:
    """The three tokens above, `chunking[i]` of them in document i."""
    out, at = [], 0
    for i, n in enumerate(chunking):
        part = TOKENS[at:at + n]
        at += n
        last = i == len(chunking) - 1
        out.append(ModelOutputDocument(
            token_ids=list(range(at - n, at)), texts=[t for t, _, _ in part], text="".join(t for t, _, _ in part),
            logprobs=[lp for _, lp, _ in part], specials=[False] * n, index=at - 1, tokens=[t for t, _, _ in part],
            alternative_counts=[len(a) for _, _, a in part], alternative_texts=[t for _, _, a in part for t, _ in a],
            alternative_ids=[7 for _, _, a in part for _ in a], alternative_logprobs=[lp for _, _, a in part for _, lp in a],
            finish_reason="length" if last else None, generated_tokens=3 if last else None,
            prompt_tokens=2 if last else None))
    return out


@pytest.mark.parametrize("chunking", [[1, 1, 1], [2, 1], [3]])
def test_chat_logprobs_streamed_join_to_whole(http, fake, chunking):
    fake.script = docs(chunking)
    body = {**CHAT, "logprobs": True, "top_logprobs": 2}
    whole = http.post("/v1/chat/completions", json=body).json()["choices"][0]["logprobs"]["content"]
    assert [(c["token"], c["logprob"]) for c in whole] == [(t, lp) for t, lp, _ in TOKENS]
    assert whole[2]["bytes"] == list("é".encode()) and [a["token"] for a in whole[0]["top_logprobs"]] == [" Paris", " the"]
    events = [e for e in sse_data(http.post("/v1/chat/completions", json={**body, "stream": True}).text.splitlines())
              if e != "[DONE]"]
    streamed = [c for e in events if e["choices"][0]["logprobs"] for c in e["choices"][0]["logprobs"]["content"]]
    assert streamed == whole
    assert fake.sent[-1].logprobs is True and fake.sent[-1].top_logprobs == 2


def test_completions_logprobs_with_offsets(http, fake):
    fake.script = docs([2, 1])
    r = http.post("/v1/completions", json={"prompt": "hi", "logprobs": 2}).json()["choices"][0]
    assert r["logprobs"]["tokens"] == [" Paris", ".", "é"] and r["logprobs"]["token_logprobs"] == [-0.25, -0.5, -1.0]
    assert r["logprobs"]["text_offset"] == [0, 6, 7] and r["logprobs"]["top_logprobs"][1] == {".": -0.5, ",": -1.5}
    assert fake.sent[-1].top_logprobs == 2 and fake.sent[-1].logprobs is True


@pytest.mark.parametrize(("route", "body", "param"), [
    ("/v1/chat/completions", {**CHAT, "top_logprobs": 3}, "top_logprobs"),
    ("/v1/completions", {"prompt": "hi", "prompt_logprobs": 2}, "prompt_logprobs"),
    ("/v1/chat/completions", {**CHAT, "prompt_logprobs": True}, "prompt_logprobs"),
])
def test_what_cannot_be_served_is_refused(http, fake, route, body, param):
    r = http.post(route, json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_no_logprobs_unless_asked(http, fake):
    fake.script = docs([3])
    assert http.post("/v1/chat/completions", json=CHAT).json()["choices"][0]["logprobs"] is None


def test_tgi_top_tokens(http, fake):
    fake.script = docs([2, 1])
    body = {"inputs": "hi", "parameters": {"details": True, "top_n_tokens": 2}}
    details = http.post("/generate", json=body).json()["details"]
    assert [t["logprob"] for t in details["tokens"]] == [-0.25, -0.5, -1.0]
    assert [[a["text"] for a in top] for top in details["top_tokens"]] == [[" Paris", " the"], [".", ","], ["é", "e"]]
    events = list(sse_data(http.post("/generate_stream", json=body).text.splitlines()))
    assert [e["top_tokens"] for e in events] == details["top_tokens"]
    assert fake.sent[-1].top_logprobs == 2
