"""OpenAI-compatible routes in the real Flow, driven by the official `openai` client and curl."""
import json

import openai
import pytest
import requests

from client import generate
from tests.gateway_helpers import curl_sse


@pytest.fixture(scope="module")
def oai(flow) -> openai.OpenAI:
    _, http_port = flow
    return openai.OpenAI(base_url=f"http://127.0.0.1:{http_port}/v1", api_key="unused", max_retries=0)


async def test_completions_stream_joins_to_non_stream_and_grpc(flow, oai):
    grpc_port, _ = flow
    ref = await generate("the quick brown fox", port=grpc_port, max_tokens=12)
    whole = oai.completions.create(model="gpt2", prompt="the quick brown fox", max_tokens=12, temperature=0)
    assert whole.choices[0].text == ref.generated_text
    assert whole.choices[0].finish_reason == "length"
    assert whole.usage.completion_tokens == 12 and whole.usage.prompt_tokens == ref.prompt_tokens
    chunks = list(oai.completions.create(model="gpt2", prompt="the quick brown fox", max_tokens=12,
                                         temperature=0, stream=True,
                                         stream_options={"include_usage": True}))
    content = [c for c in chunks if c.choices]
    assert "".join(c.choices[0].text for c in content) == ref.generated_text
    assert [c.choices[0].finish_reason for c in content[:-1]] == [None] * (len(content) - 1)
    assert content[-1].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == ref.prompt_tokens + 12


def test_chat_stream_joins_to_non_stream(oai):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]
    whole = oai.chat.completions.create(model="gpt2", messages=messages, max_tokens=10, temperature=0)
    answer = whole.choices[0].message
    assert answer.role == "assistant" and answer.content
    assert whole.usage.completion_tokens == 10
    stream = oai.chat.completions.create(model="gpt2", messages=messages, max_completion_tokens=10,
                                         temperature=0, stream=True)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == answer.content
    assert chunks[-1].choices[0].finish_reason == "length"


async def test_chat_uses_the_engines_plain_format(flow, oai):
    """The tiny model has no chat template: the engine renders its documented plain format."""
    grpc_port, _ = flow
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
                {"role": "user", "content": "and then?"}]
    ref = await generate("User: hi\nAssistant: hello\nUser: and then?\nAssistant:", port=grpc_port,
                         max_tokens=8)
    whole = oai.chat.completions.create(model="gpt2", messages=messages, max_tokens=8, temperature=0)
    assert whole.choices[0].message.content == ref.generated_text
    assert whole.usage.prompt_tokens == ref.prompt_tokens


def test_stop_sequence_and_seeded_sampling(oai):
    full = oai.completions.create(model="gpt2", prompt="streams of tokens", max_tokens=16, temperature=0)
    text = full.choices[0].text
    stop = text[len(text) // 2:len(text) // 2 + 2]
    assert stop.strip(), f"pick another prompt: {text!r}"
    cut = oai.completions.create(model="gpt2", prompt="streams of tokens", max_tokens=16, temperature=0,
                                 stop=[stop, "never-there"])
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == text[:text.index(stop)]
    # temperature absent = OpenAI's default 1.0 with sampling; a seed makes it repeatable
    a = oai.completions.create(model="gpt2", prompt="hello", max_tokens=10, seed=5)
    b = "".join(c.choices[0].text for c in oai.completions.create(model="gpt2", prompt="hello",
                                                                  max_tokens=10, seed=5, stream=True))
    assert a.choices[0].text == b


@pytest.mark.parametrize("kwargs,param", [({"n": 17}, "n"), ({"max_tokens": 0}, "max_tokens"),
                                          ({"top_p": 1.5}, "top_p"), ({"temperature": -1}, "temperature")])
def test_invalid_requests_are_400_with_an_openai_error(oai, kwargs, param):
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as err:
            oai.completions.create(model="gpt2", prompt="hello", stream=stream, **{"max_tokens": 4, **kwargs})
        assert err.value.status_code == 400
        body = err.value.body
        assert body["param"] == param and body["code"] == "validation" and param in body["message"]


def test_chat_validation_and_raw_errors(flow):
    _, http_port = flow
    url = f"http://127.0.0.1:{http_port}/v1/chat/completions"
    r = requests.post(url, json={"messages": [{"role": "wizard", "content": "hi"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    r = requests.post(url, data=b"{not json")
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = requests.post(url, json={"messages": "hi"})
    assert r.status_code == 400 and r.json()["error"]["param"].startswith("messages")


def test_curl_streams_sse_chunks_then_done(flow):
    _, http_port = flow
    events = curl_sse(f"http://127.0.0.1:{http_port}/v1/chat/completions",
                      {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6,
                       "temperature": 0, "stream": True, "stream_options": {"include_usage": True}})
    assert events[-1] == "[DONE]"
    usage = events[-2]["usage"]
    assert usage["completion_tokens"] == 6
    content = [e for e in events[:-2]]
    assert all(e["object"] == "chat.completion.chunk" for e in content)
    assert content[-1]["choices"][0]["finish_reason"] == "length"


def test_models_lists_the_served_model(flow, oai, gpt2_model):
    models = oai.models.list().data
    assert [m.id for m in models] == ["gpt2"]  # the folder's name, not its path
    _, http_port = flow
    info = requests.get(f"http://127.0.0.1:{http_port}/v1/models").json()
    assert info["data"][0]["max_model_len"] == 512 and json.dumps(info)
