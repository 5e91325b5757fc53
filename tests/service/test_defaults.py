"""What users actually send: each protocol's minimal request with every default left alone
(OpenAI's default samples at temperature 1 with no seed), and seeds over the whole 64-bit
range, reported exactly, on every protocol. A seed past 2**64 - 1 is refused naming `seed`."""
import json
import subprocess
import sys

import pytest
import requests
import websockets
from docarray import DocList

from client import StreamError, make_client, stream
from schemas import ModelOutputDocument, PromptDocument
from tests.conftest import ROOT
from tests.gateway_helpers import sse_data

SEED_MAX = 2**64 - 1
SEEDS = [0, 2**31, 2**63, SEED_MAX]


def positions(docs: list[dict]) -> list[int]:
    """The generation index of every token the documents cover, in order."""
    return [d["index"] - len(d["token_ids"]) + 1 + i for d in docs for i in range(len(d["token_ids"]))]


def post(http_port: int, path: str, body: dict) -> requests.Response:
    return requests.post(f"http://127.0.0.1:{http_port}{path}", json=body, timeout=120)


def post_sse(http_port: int, path: str, body: dict) -> tuple[int, list]:
    with requests.post(f"http://127.0.0.1:{http_port}{path}", json=body, stream=True, timeout=120) as r:
        return r.status_code, list(sse_data(r.iter_lines(decode_unicode=True)))


def jina_sse(http_port: int, body: dict | None = None, params: dict | None = None) -> tuple[int, list]:
    with requests.get(f"http://127.0.0.1:{http_port}/stream", json=body, params=params,
                      stream=True, timeout=120) as r:
        return r.status_code, list(sse_data(r.iter_lines(decode_unicode=True)))


def ended_by_length_or_eos(tokens: int, max_tokens: int, finish_reason: str) -> bool:
    """Sampling may draw EOS before max_tokens, even on the random test model."""
    return (tokens, finish_reason) == (max_tokens, "length") or (
        tokens <= max_tokens and finish_reason in ("eos_token", "stop"))


def assert_whole_stream(docs: list[dict]) -> None:
    """Every token once, in order; the texts join up; it ends with a finish_reason."""
    assert docs and all(d["error"] is None for d in docs), docs[-1:]
    assert positions(docs) == list(range(docs[-1]["generated_tokens"]))
    assert "".join(d["text"] for d in docs) == docs[-1]["generated_text"]
    assert docs[-1]["finish_reason"] in ("length", "eos_token")


# ----- the minimal request of each protocol -----

def test_openai_completions_minimal(flow):
    _, http_port = flow
    r = post(http_port, "/v1/completions", {"prompt": "Hello"})
    assert r.status_code == 200, r.text
    body = r.json()
    # OpenAI's default max_tokens for completions is 16 (a sampled EOS may end it sooner)
    assert ended_by_length_or_eos(body["usage"]["completion_tokens"], 16, body["choices"][0]["finish_reason"])
    assert body["seed"] >= 0
    status, events = post_sse(http_port, "/v1/completions", {"prompt": "Hello", "stream": True})
    assert status == 200 and events[-1] == "[DONE]"
    assert [e["choices"][0]["finish_reason"] for e in events[:-1]][-1] in ("length", "stop")


def test_openai_chat_minimal(flow):
    _, http_port = flow
    messages = [{"role": "user", "content": "Hello"}]
    r = post(http_port, "/v1/chat/completions", {"messages": messages})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert body["choices"][0]["finish_reason"] in ("length", "stop") and isinstance(body["seed"], int)
    status, events = post_sse(http_port, "/v1/chat/completions",
                              {"messages": messages, "stream": True})
    assert status == 200 and events[-1] == "[DONE]", events[-3:]
    assert all("error" not in e for e in events[:-1])
    assert events[-2]["choices"][0]["finish_reason"] in ("length", "stop")


def test_tgi_minimal(flow):
    _, http_port = flow
    r = post(http_port, "/generate", {"inputs": "Hello"})
    assert r.status_code == 200 and r.json()["generated_text"], r.text
    r = post(http_port, "/", {"inputs": "Hello"})
    assert r.status_code == 200 and r.json()[0]["generated_text"], r.text
    for path, body in (("/generate_stream", {"inputs": "Hello"}), ("/", {"inputs": "Hello", "stream": True})):
        status, events = post_sse(http_port, path, body)
        assert status == 200
        assert [e["index"] for e in events] == list(range(1, 21))  # TGI's default max_new_tokens
        assert events[-1]["generated_text"] == "".join(e["token"]["text"] for e in events)


@pytest.mark.parametrize("sampling", [{}, {"do_sample": True}])
def test_jina_sse_minimal(flow, sampling):
    _, http_port = flow
    status, docs = jina_sse(http_port, {"prompt": "Hello", **sampling})
    assert status == 200
    assert_whole_stream(docs)
    # PromptDocument's default max_tokens is 64
    assert ended_by_length_or_eos(docs[-1]["generated_tokens"], 64, docs[-1]["finish_reason"])
    assert (docs[-1]["seed"] is not None) == bool(sampling)
    status, docs = jina_sse(http_port, params={"prompt": "Hello", **sampling})  # the query-string form
    assert status == 200
    assert_whole_stream(docs)


@pytest.mark.parametrize("sampling", [{}, {"do_sample": True}])
async def test_grpc_stream_doc_minimal(flow, sampling):
    grpc_port, _ = flow
    docs = [d async for d in stream("Hello", port=grpc_port, **sampling)]
    assert_whole_stream([d.model_dump() for d in docs])
    assert (docs[-1].seed is not None) == bool(sampling)


@pytest.mark.parametrize("sampling", [{}, {"do_sample": True}])
async def test_grpc_unary_generate_minimal(flow, sampling):
    grpc_port, _ = flow
    client = make_client(port=grpc_port)
    docs = DocList[PromptDocument]([PromptDocument(prompt="Hello", **sampling)])
    out = [d async for d in client.post("/generate", docs, return_type=DocList[ModelOutputDocument])]
    result = (out[0] if isinstance(out[0], DocList) else out)[0]
    assert result.error is None and result.text == result.generated_text
    assert ended_by_length_or_eos(len(result.token_ids), 64, result.finish_reason)
    assert (result.seed is not None) == bool(sampling)


async def test_websocket_chat_minimal(flow):
    _, http_port = flow
    async with websockets.connect(f"ws://127.0.0.1:{http_port}/chat") as ws:
        for message in ("Hello", json.dumps({"prompt": "Hello"})):
            await ws.send(message)
            events = []
            while not events or events[-1]["type"] == "token":
                events.append(json.loads(await ws.recv()))
            assert events[-1]["type"] == "end" and events[-1]["finish_reason"] == "length", events[-1]
            assert sum(len(e["token_ids"]) for e in events[:-1]) == events[-1]["generated_tokens"] == 64


@pytest.mark.parametrize("args", [[], ["--do-sample"], ["--chat"], ["--protocol", "http", "--do-sample"]])
def test_cli_minimal(flow, args):
    grpc_port, http_port = flow
    port = http_port if "http" in args else grpc_port
    run = subprocess.run([sys.executable, "-m", "client", "Hello", "--port", str(port), *args],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stderr.count("\n") == 1 and run.stderr.startswith("[finish_reason=")  # no warnings
    assert ("seed=None" in run.stderr) != ("--do-sample" in args)


# ----- seeds over the whole 64-bit range, and past it -----

async def test_seeds_over_grpc_and_jina_sse(flow):
    grpc_port, http_port = flow
    for seed in SEEDS:
        docs = [d async for d in stream("Hello", port=grpc_port, max_tokens=6, do_sample=True, seed=seed)]
        assert docs[-1].seed == seed
        status, events = jina_sse(http_port, {"prompt": "Hello", "max_tokens": 6, "do_sample": True, "seed": seed})
        assert status == 200 and events[-1]["seed"] == seed
        assert events[-1]["generated_text"] == docs[-1].generated_text  # the same seed, the same text
    with pytest.raises(StreamError, match="seed"):
        await anext(stream("Hello", port=grpc_port, do_sample=True, seed=SEED_MAX + 1))
    status, events = jina_sse(http_port, {"prompt": "Hello", "seed": SEED_MAX + 1})
    assert status == 422 and events[0]["error_type"] == "validation"
    assert events[0]["error"].startswith("seed:")


def test_seeds_over_openai_and_tgi(flow):
    _, http_port = flow
    for seed in SEEDS:
        body = {"prompt": "Hello", "max_tokens": 6, "seed": seed}
        whole = post(http_port, "/v1/completions", body).json()
        assert whole["seed"] == seed
        _, events = post_sse(http_port, "/v1/completions", {**body, "stream": True})
        assert "".join(e["choices"][0]["text"] for e in events[:-1]) == whole["choices"][0]["text"]
        assert events[-2]["seed"] == seed
        tgi = {"inputs": "Hello", "parameters": {"max_new_tokens": 6, "do_sample": True, "seed": seed,
                                                 "details": True}}
        assert post(http_port, "/generate", tgi).json()["details"]["seed"] == seed
        _, events = post_sse(http_port, "/generate_stream", tgi)
        assert events[-1]["details"]["seed"] == seed
    r = post(http_port, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                                 "seed": SEED_MAX + 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "seed", r.text
    r = post(http_port, "/generate", {"inputs": "x", "parameters": {"seed": SEED_MAX + 1}})
    assert r.status_code == 422 and r.json()["error"].startswith("seed"), r.text


async def test_seeds_over_websocket_and_cli(flow):
    grpc_port, http_port = flow
    async with websockets.connect(f"ws://127.0.0.1:{http_port}/chat") as ws:
        for seed in (SEED_MAX, SEED_MAX + 1):
            await ws.send(json.dumps({"prompt": "Hello", "max_tokens": 4, "do_sample": True, "seed": seed}))
            event = json.loads(await ws.recv())
            while event["type"] == "token":
                event = json.loads(await ws.recv())
            if seed == SEED_MAX:
                assert event["type"] == "end" and event["seed"] == seed
            else:
                assert event["type"] == "error" and event["error"].startswith("seed")
    for seed, code in ((SEED_MAX, 0), (SEED_MAX + 1, 2)):
        run = subprocess.run([sys.executable, "-m", "client", "Hello", "--do-sample", "--seed", str(seed),
                              "--max-tokens", "4", "--port", str(grpc_port)],
                             cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert run.returncode == code, run.stderr
        assert (f"seed={seed}]" if code == 0 else "error: validation: seed") in run.stderr
