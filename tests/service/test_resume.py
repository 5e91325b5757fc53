"""A stream that survives its dropped connection, through a real Flow: the client reads a few
events of an SSE stream and leaves, the generation stops, and a reconnect with `Last-Event-ID`
gets the events after that id and then the rest, made from the tokens already sent. Joined, the
two parts are the events of an unbroken run: the same text, the same usage, ids without a gap. The
WebSocket chat's answers resume the same way."""
import json
import time

import pytest
import requests

from tests.gateway_helpers import busy, wait_until

BODIES = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 48, "temperature": 0,
                             "stream": True, "stream_options": {"include_usage": True}},
    "/v1/completions": {"prompt": "hello", "max_tokens": 48, "temperature": 0.8, "seed": 5, "stream": True},
    "/v1/messages": {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 48, "temperature": 0,
                     "stream": True},
}


def events(response: requests.Response, limit: int = 10**9) -> list[dict]:
    """Each event's id and data (as text), the first `limit` of them."""
    out: list[dict] = []
    current: dict = {}
    for line in response.iter_lines(decode_unicode=True):
        if not line:
            if current:
                out.append(current)
                current = {}
                if len(out) >= limit:
                    break
            continue
        key, _, value = line.partition(": ")
        current[key] = value
    return out


def text_of(path: str, evs: list[dict]) -> str:
    text = ""
    for e in evs:
        if e.get("data", "[DONE]") == "[DONE]":
            continue
        data = json.loads(e["data"])
        if path == "/v1/chat/completions" and data["choices"]:
            text += data["choices"][0]["delta"].get("content") or ""
        elif path == "/v1/completions":
            text += data["choices"][0]["text"]
        elif path == "/v1/messages" and data["type"] == "content_block_delta":
            text += data["delta"]["text"]
    return text


def usage(evs: list[dict]) -> list:
    """The usage reports, but for what the prefix cache held: that depends on the requests before
    (the unbroken run's prompt was new; the cut run's was cached by then)."""
    reports = [json.loads(e["data"]).get("usage") for e in evs if e.get("data", "[DONE]") != "[DONE]"]
    return [{k: v + (r.get("cache_read_input_tokens") or 0) if k == "input_tokens" else v  # Anthropic's: less the cached
             for k, v in r.items() if "cache" not in k and k != "prompt_tokens_details"} for r in reports if r]


@pytest.mark.parametrize("path", list(BODIES))
def test_a_dropped_stream_goes_on_from_its_last_event_id(slow_flow, path):
    _, http = slow_flow
    url = f"http://127.0.0.1:{http}{path}"
    with requests.post(url, json=BODIES[path], stream=True, timeout=60) as r:
        whole = events(r)
    with requests.post(url, json=BODIES[path], stream=True, timeout=60) as r:
        assert r.status_code == 200
        head = events(r, limit=6)
    # the connection is gone: the generation stops long before its 48 tokens
    assert busy(wait_until(http, lambda s: busy(s) == 0, timeout=20)) == 0
    with requests.post(url, json=BODIES[path], headers={"Last-Event-ID": head[-1]["id"]}, stream=True, timeout=60) as r:
        assert r.status_code == 200, r.text
        tail = events(r)
    joined = head + tail
    stream_id = head[0]["id"].rsplit("/", 1)[0]
    assert [e["id"] for e in joined] == [f"{stream_id}/{i}" for i in range(len(joined))]
    assert text_of(path, joined) == text_of(path, whole) and len(text_of(path, whole)) > 20
    assert usage(joined) == usage(whole)
    assert kinds(joined) == kinds(whole)


def kinds(evs: list[dict]) -> list:
    """The events' kinds in order, a run of one kind counted once: a reader that falls behind gets
    several tokens in one event (the same text, fewer deltas), so the runs' lengths vary with the load."""
    out: list = []
    for e in evs:
        if not out or out[-1] != e.get("event"):
            out.append(e.get("event"))
    return out


def test_an_unknown_or_foreign_last_event_id_is_refused_naming_the_header(slow_flow):
    _, http = slow_flow
    url = f"http://127.0.0.1:{http}/v1/chat/completions"
    with requests.post(url, json=BODIES["/v1/chat/completions"], stream=True, timeout=60) as r:
        first = events(r, limit=1)[0]["id"]
    time.sleep(0.2)
    for last in ("strm_nothing/3", first):
        target = url if last != first else f"http://127.0.0.1:{http}/v1/completions"  # another route's
        r = requests.post(target, json={"prompt": "x", "stream": True}, headers={"Last-Event-ID": last}, timeout=30)
        assert r.status_code == 404, r.text
        assert "Last-Event-ID" in r.text


def test_a_background_response_generates_on_and_is_read_from_any_point(slow_flow):
    """The openai SDK's `background=True`: the answer at once, in progress; then the whole
    response by its id, its events after a sequence number, a cancel, and a delete."""
    import openai
    _, http = slow_flow
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{http}/v1", api_key="unused")
    model = client.models.list().data[0].id
    ask = {"model": model, "input": "hello", "max_output_tokens": 32, "temperature": 0}
    whole = client.responses.create(**ask)
    started = client.responses.create(**ask, background=True)
    assert started.status == "in_progress" and started.background and started.output == []
    deadline = time.monotonic() + 60
    while (kept := client.responses.retrieve(started.id)).status == "in_progress" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert kept.status == whole.status and kept.output_text == whole.output_text and len(whole.output_text) > 10
    assert kept.usage.output_tokens == whole.usage.output_tokens
    # a later request goes on from the kept one: its conversation, then the new input
    follow = {"model": model, "input": "and then?", "max_output_tokens": 8, "temperature": 0}
    went_on = client.responses.create(**follow, previous_response_id=started.id)
    spelled_out = client.responses.create(**{**follow, "input": [
        {"role": "user", "content": "hello"}, {"role": "assistant", "content": whole.output_text},
        {"role": "user", "content": "and then?"}]})
    assert went_on.previous_response_id == started.id
    assert went_on.output_text == spelled_out.output_text
    assert went_on.usage.input_tokens == spelled_out.usage.input_tokens > whole.usage.input_tokens + 10
    for unknown in ("resp_nothing", whole.id):  # never kept, or not in the background
        with pytest.raises(openai.BadRequestError) as refused:
            client.responses.create(**follow, previous_response_id=unknown)
        assert refused.value.body["param"] == "previous_response_id"
    events = list(client.responses.retrieve(started.id, stream=True))  # every event, from the first
    after = list(client.responses.retrieve(started.id, stream=True, starting_after=3))
    assert [e.sequence_number for e in after] == list(range(4, 4 + len(after)))
    assert [e.model_dump() for e in after] == [e.model_dump() for e in events[4:]]  # exactly the rest
    assert after[-1].type == f"response.{whole.status}"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == whole.output_text

    long = client.responses.create(**{**ask, "max_output_tokens": 600}, background=True)
    time.sleep(0.5)
    assert client.responses.cancel(long.id).status == "cancelled"
    assert busy(wait_until(http, lambda s: busy(s) == 0, timeout=20)) == 0  # its generation stopped
    client.responses.delete(long.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(long.id)
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(**ask, store=True)
    assert refused.value.body["param"] == "store"


async def answer_events(ws, limit: int = 10**9) -> list[dict]:
    """A WebSocket answer's events, to its end (or the first `limit`)."""
    out: list[dict] = []
    while len(out) < limit:
        out.append(json.loads(await ws.recv()))
        if out[-1]["type"] != "token":
            break
    return out


async def test_a_dropped_websocket_answer_goes_on_after_a_resume(slow_flow):
    """The chat page's socket drops mid-answer: the generation stops; a new socket that sends
    `resume` with the last id it got gets the rest, and the conversation goes on from there."""
    import websockets
    _, http = slow_flow
    url = f"ws://127.0.0.1:{http}/chat"
    ask = {"prompt": "hello", "max_tokens": 48, "temperature": 0}
    async with websockets.connect(url) as ws:
        await ws.send(json.dumps(ask))
        whole = await answer_events(ws)
    async with websockets.connect(url) as ws:
        await ws.send(json.dumps(ask))
        head = await answer_events(ws, limit=6)
    assert busy(wait_until(http, lambda s: busy(s) == 0, timeout=20)) == 0  # stopped with its socket
    async with websockets.connect(url) as ws:
        await ws.send(json.dumps({"type": "resume", "last_event_id": "strm_nothing/3"}))
        refused = json.loads(await ws.recv())
        assert refused["type"] == "error" and refused["error_type"] == "not_found"
        assert "last_event_id" in refused["error"]
        await ws.send(json.dumps({"type": "resume", "last_event_id": head[-1]["id"]}))
        tail = await answer_events(ws)
        await ws.send(json.dumps({"prompt": "and then?", "max_tokens": 2}))
        next_turn = await answer_events(ws)
    joined = head + tail
    stream_id = head[0]["id"].rsplit("/", 1)[0]
    assert [e["id"] for e in joined] == [f"{stream_id}/{i}" for i in range(len(joined))]

    def text(events: list[dict]) -> str:
        return "".join(e["text"] for e in events if e["type"] == "token")
    assert text(joined) == text(whole) and len(text(whole)) > 20
    # the same tokens in order (a reader that falls behind gets several in one message)
    def tokens(events: list[dict]) -> list[int]:
        return [t for e in events for t in e.get("token_ids") or []]
    assert tokens(joined) == tokens(whole)
    unsaid = ("id", "cached_tokens", "token_ids", "text")
    assert {k: v for k, v in joined[-1].items() if k not in unsaid} == \
           {k: v for k, v in whole[-1].items() if k not in unsaid}
    # the resumed socket holds the conversation: the next prompt comes after the whole answer
    assert next_turn[-1]["prompt_tokens"] > whole[-1]["prompt_tokens"] + whole[-1]["generated_tokens"]
