"""Several answers (n, TGI's best_of) and prompt scores (echo with logprobs, TGI's
decoder_input_details) in each protocol's shape, from the executor's documents: answers
interleave, each with its `choice_index`, and an answer's first document carries the prompt's
numbers."""
import pytest

from schemas import ModelOutputDocument
from tests.gateway_helpers import sse_data

PROMPT = dict(prompt_token_ids=[5, 6, 7], prompt_token_texts=["The", " sky", " is"], prompt_logprobs=[-2.0, -0.5],
              prompt_alternative_counts=[1, 1], prompt_alternative_ids=[6, 8],
              prompt_alternative_texts=[" sky", " sea"], prompt_alternative_logprobs=[-2.0, -0.25])


def doc(choice: int, index: int, text: str, logprob: float, last: bool = False, first: bool = False,
        **extra) -> ModelOutputDocument:
    return ModelOutputDocument(
        choice_index=choice, token_ids=[10 + index], texts=[text], text=text, logprobs=[logprob], specials=[False],
        index=index, tokens=[text], alternative_counts=[1], alternative_ids=[10 + index], alternative_texts=[text],
        alternative_logprobs=[logprob], finish_reason="length" if last else None,
        generated_tokens=index + 1 if last else None, prompt_tokens=3 if last else None,
        seed=40 + choice if last else None, **(PROMPT if first else {}), **extra)


def two_answers() -> list[ModelOutputDocument]:
    """Answer 0 (" blue", "."), answer 1 (" grey", "!"), interleaved as the batch makes them."""
    return [doc(0, 0, " blue", -0.5, first=True), doc(1, 0, " grey", -1.0, first=True),
            doc(1, 1, "!", -3.0, last=True), doc(0, 1, ".", -0.25, last=True)]


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_n_answers_each_with_its_index_and_usage_counts_the_prompt_once(http, fake, route):
    fake.script = two_answers()
    body = {"n": 2, "max_tokens": 2,
            **({"messages": [{"role": "user", "content": "hi"}]} if "chat" in route else {"prompt": "hi"})}
    whole = http.post(route, json=body).json()
    texts = [c["message"]["content"] if "chat" in route else c["text"] for c in whole["choices"]]
    assert texts == [" blue.", " grey!"] and [c["index"] for c in whole["choices"]] == [0, 1]
    assert whole["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7,
                              "prompt_tokens_details": {"cached_tokens": 0}}
    assert fake.sent[-1].n == 2
    stream = {**body, "stream": True, "stream_options": {"include_usage": True}}
    events = [e for e in sse_data(http.post(route, json=stream).text.splitlines()) if e != "[DONE]"]
    joined: dict[int, str] = {}
    for e in events:
        for c in e["choices"]:
            joined[c["index"]] = joined.get(c["index"], "") + (c["delta"].get("content") or "" if "chat" in route
                                                               else c["text"])
    assert joined == {0: " blue.", 1: " grey!"}
    assert events[-1]["usage"] == whole["usage"] and events[-1]["choices"] == []
    finishes = [c["index"] for e in events for c in e["choices"] if c["finish_reason"]]
    assert sorted(finishes) == [0, 1]


@pytest.mark.parametrize("stream", [False, True])
def test_completions_echo_with_logprobs_scores_the_prompt(http, fake, stream):
    fake.script = [doc(0, 0, " blue", -0.5, first=True), doc(0, 1, ".", -0.25, last=True)]
    body = {"prompt": "The sky is", "echo": True, "logprobs": 1, "max_tokens": 2, "stream": stream}
    r = http.post("/v1/completions", json=body)
    if stream:
        chunks = [e["choices"][0] for e in sse_data(r.text.splitlines()) if e != "[DONE]"]
        text = "".join(c["text"] for c in chunks)
        logprobs = {k: [v for c in chunks for v in c["logprobs"][k]] for k in chunks[0]["logprobs"]}
    else:
        text, logprobs = r.json()["choices"][0]["text"], r.json()["choices"][0]["logprobs"]
    assert text == "The sky is blue."
    assert logprobs["tokens"] == ["The", " sky", " is", " blue", "."]
    assert logprobs["token_logprobs"] == [None, -2.0, -0.5, -0.5, -0.25]
    assert logprobs["top_logprobs"] == [None, {" sky": -2.0}, {" sea": -0.25}, {" blue": -0.5}, {".": -0.25}]
    assert logprobs["text_offset"] == [0, 3, 7, 10, 15]
    assert fake.sent[-1].prompt_logprobs is True and fake.sent[-1].top_logprobs == 1


def test_echo_without_generating_scores_only_the_prompt(http, fake):
    fake.script = [ModelOutputDocument(finish_reason="length", prompt_tokens=3, generated_tokens=0, **PROMPT)]
    r = http.post("/v1/completions", json={"prompt": "The sky is", "echo": True, "logprobs": 0,
                                           "max_tokens": 0}).json()
    choice = r["choices"][0]
    assert choice["text"] == "The sky is" and choice["logprobs"]["token_logprobs"] == [None, -2.0, -0.5]
    assert fake.sent[-1].max_tokens == 0 and fake.sent[-1].prompt_logprobs is True


def test_tgi_best_of_returns_the_likeliest_and_the_others_in_details(http, fake):
    fake.script = two_answers()
    body = {"inputs": "hi", "parameters": {"best_of": 2, "do_sample": True, "details": True,
                                           "decoder_input_details": True}}
    r = http.post("/generate", json=body).json()
    assert r["generated_text"] == " blue."  # -0.75 against -4.0
    assert r["details"]["prefill"] == [{"id": 5, "text": "The", "logprob": None},
                                       {"id": 6, "text": " sky", "logprob": -2.0},
                                       {"id": 7, "text": " is", "logprob": -0.5}]
    [other] = r["details"]["best_of_sequences"]
    assert other["generated_text"] == " grey!" and other["seed"] == 41 and len(other["prefill"]) == 3
    assert fake.sent[-1].n == 2 and fake.sent[-1].prompt_logprobs is True


@pytest.mark.parametrize(("parameters", "field"), [
    ({"best_of": 2}, "best_of"),  # greedy: TGI wants sampling
    ({"best_of": 2, "do_sample": True, "seed": 3}, "seed"),
])
def test_tgi_best_of_follows_tgi_rules(http, fake, parameters, field):
    r = http.post("/generate", json={"inputs": "hi", "parameters": parameters})
    assert r.status_code == 422 and r.json()["error"].startswith(field), r.text
    assert not fake.sent


@pytest.mark.parametrize("parameters", [{"best_of": 2, "do_sample": True}, {"decoder_input_details": True}])
def test_tgi_refuses_them_when_streaming(http, fake, parameters):
    r = http.post("/generate_stream", json={"inputs": "hi", "parameters": parameters})
    assert r.status_code == 422 and r.json()["error"].startswith(next(iter(parameters))), r.text
