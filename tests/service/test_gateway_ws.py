"""The WebSocket chat (/chat) in the real Flow, with the `websockets` client; and the page."""
import json

import pytest
import requests
import websockets

from client import generate


async def ask(ws, message) -> tuple[str, list[dict], dict]:
    """Send one prompt; return (answer text, token events, end or error event)."""
    await ws.send(message if isinstance(message, str) else json.dumps(message))
    tokens = []
    while True:
        event = json.loads(await ws.recv())
        if event["type"] == "token":
            tokens.append(event)
        else:
            return "".join(t["text"] for t in tokens), tokens, event


@pytest.fixture
async def ws(flow):
    _, http_port = flow
    async with websockets.connect(f"ws://127.0.0.1:{http_port}/chat") as conn:
        yield conn


async def test_conversation_keeps_context(flow, ws):
    grpc_port, _ = flow
    first, tokens, end = await ask(ws, {"prompt": "hello there", "max_tokens": 6})
    assert end == {"type": "end", "finish_reason": "length", "prompt_tokens": end["prompt_tokens"],
                   "cached_tokens": end["cached_tokens"], "generated_tokens": 6, "seed": None, "id": end["id"]}
    assert [t["id"] for t in tokens] + [end["id"]] == [f"{end['id'].rsplit('/', 1)[0]}/{i}" for i in range(len(tokens) + 1)]
    assert sum(len(t["token_ids"]) for t in tokens) == 6
    ref1 = await generate("User: hello there\nAssistant:", port=grpc_port, max_tokens=6)
    assert first == ref1.generated_text
    # the second turn is answered in the context of the first (greedy: same as gRPC with history)
    second, _, end2 = await ask(ws, "what next?")  # plain text frame = the prompt
    history = [{"role": "user", "content": "hello there"}, {"role": "assistant", "content": first},
               {"role": "user", "content": "what next?"}]
    ref2 = await generate("", port=grpc_port, max_tokens=64, messages=json.dumps(history))
    assert second == ref2.generated_text
    assert end2["prompt_tokens"] == ref2.prompt_tokens > end["prompt_tokens"] + 6
    # the second turn resends the first, whose blocks the prefix cache kept (answer included)
    assert end2["cached_tokens"] >= 16 * ((end["prompt_tokens"] + 5) // 16)


async def test_token_events_carry_logprobs_when_asked(ws):
    _, tokens, end = await ask(ws, {"prompt": "hello there", "max_tokens": 4, "top_logprobs": 2})
    entries = [e for t in tokens for e in t["logprobs"]]
    assert len(entries) == 4 and all(len(e["top_logprobs"]) == 2 and e["logprob"] <= 0 for e in entries)
    _, tokens, _ = await ask(ws, {"prompt": "hello there", "max_tokens": 2})
    assert all("logprobs" not in t for t in tokens)


async def test_errors_keep_the_connection_usable(ws):
    _, _, err = await ask(ws, {"prompt": "hi", "top_p": 5})
    assert err["type"] == "error" and err["error_type"] == "validation" and "top_p" in err["error"]
    _, _, err = await ask(ws, {"prompt": "hi", "colour": "blue"})
    assert err["type"] == "error" and "colour" in err["error"]
    _, _, err = await ask(ws, {"prompt": "hi", "max_tokens": "many"})
    assert err["type"] == "error" and "max_tokens" in err["error"]
    _, _, err = await ask(ws, {"prompt": "  "})
    assert err["type"] == "error" and "prompt" in err["error"]
    for field in ({"n": 2}, {"prompt_logprobs": True}):  # one answer per turn, and no prompt scores
        _, _, err = await ask(ws, {"prompt": "hi", **field})
        assert err["type"] == "error" and err["error"].startswith(next(iter(field)))
    text, _, end = await ask(ws, {"prompt": "still there?", "max_tokens": 3})
    assert end["type"] == "end" and end["generated_tokens"] == 3
    # the failed turns were not remembered: one user turn in the prompt
    ref_prompt_tokens = end["prompt_tokens"]
    await ws.send(json.dumps({"type": "reset"}))
    _, _, again = await ask(ws, {"prompt": "still there?", "max_tokens": 3})
    assert again["prompt_tokens"] == ref_prompt_tokens


async def test_a_history_message_replaces_the_conversation(flow, ws):
    """What the chat page sends before each question: the branch's messages. A malformed one is
    refused naming `messages` (the socket stays usable); a good one is the context of the next
    prompt, as the same messages are over gRPC."""
    grpc_port, _ = flow
    for bad, named in (("x", "messages:"), ([{"role": "robot", "content": "x"}], "messages[0]:"),
                       ([{"role": "user"}], "messages[0]:"), ([{"role": "user", "content": "x"}] * 201, "messages:")):
        await ws.send(json.dumps({"type": "history", "messages": bad}))
        err = json.loads(await ws.recv())
        assert err["type"] == "error" and err["error"].startswith(named), err
    history = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"},
               {"role": "assistant", "content": "hi"}]
    await ws.send(json.dumps({"type": "history", "messages": history}))
    text, _, end = await ask(ws, {"prompt": "what next?", "max_tokens": 6})
    ref = await generate("", port=grpc_port, max_tokens=6,
                         messages=json.dumps(history + [{"role": "user", "content": "what next?"}]))
    assert text == ref.generated_text and end["prompt_tokens"] == ref.prompt_tokens


async def test_long_conversations_drop_the_oldest_turns(ws):
    """The tiny model's context is 512 tokens; each turn here is over 100 tokens."""
    ends = []
    for i in range(6):
        _, _, end = await ask(ws, {"prompt": f"turn {i}: " + "the quick brown fox " * 25, "max_tokens": 40})
        assert end["type"] == "end", end
        assert end["prompt_tokens"] + 40 <= 512
        ends.append(end["prompt_tokens"])
    assert ends[1] > ends[0] + 100  # the second turn carried the first
    # without trimming, six turns of 100+ tokens could not fit 512 tokens at all


def test_chat_page_is_served(flow):
    """The page, and everything it loads, from this service: its script, its pinned libraries
    (byte for byte as VERSIONS says) and its settings, read from the request contract."""
    import hashlib
    import re

    from contract import request_fields
    from gateway.protocols.chat_files import ASSETS
    from tests.conftest import ROOT
    _, http_port = flow
    base = f"http://127.0.0.1:{http_port}"
    r = requests.get(f"{base}/chat-ui", timeout=30)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert 'id="stop"' in r.text
    loaded = re.findall(r'(?:src|href)="(/chat-ui/[^"]+)"', r.text)
    assert sorted(loaded) == sorted(f"/chat-ui/{name}" for name in ASSETS)  # each file it loads, declared once
    assert not re.search(r'(?:src|href)="(?:https?:)?//', r.text)  # nothing from elsewhere
    for path in loaded:
        asset = requests.get(base + path, timeout=30)
        assert asset.status_code == 200 and asset.headers["content-type"].startswith(("text/javascript", "text/css"))
    assert "new WebSocket(" in requests.get(f"{base}/chat-ui/chat.js", timeout=30).text
    for line in (ROOT / "gateway/static/vendor/VERSIONS").read_text().splitlines():
        if not line.startswith("#"):
            _, _, file, digest = line.split()
            body = requests.get(f"{base}/chat-ui/vendor/{file.rsplit('/', 1)[-1]}", timeout=30).content
            assert hashlib.sha256(body).hexdigest() == digest, file
    settings = requests.get(f"{base}/chat-ui/settings", timeout=30).json()
    declared = {f.name: f for f in request_fields()}
    assert settings["models"] and {s["name"] for s in settings["fields"]} <= set(declared)
    for s in settings["fields"]:
        assert s["help"] == declared[s["name"]].metadata["help"]


async def test_next_prompt_right_after_end_and_a_late_stop(ws):
    """The session is idle once "end" is sent: an immediate next prompt is answered, and a
    stop that arrives after the end changes nothing (the finished turn is kept once)."""
    for turn in range(3):
        _, _, end = await ask(ws, {"prompt": f"turn {turn}", "max_tokens": 3})
        assert end["type"] == "end" and end["finish_reason"] == "length", end
        await ws.send(json.dumps({"type": "stop"}))  # late: nothing is running
