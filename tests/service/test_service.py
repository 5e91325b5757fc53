"""The executor in a real Flow (flows/llm.yml, as `make serve` runs it) over gRPC and HTTP SSE."""
import asyncio
import json
import os
import subprocess
import sys

import grpc
import pytest
import requests

from client import StreamError, connect, generate, stream
from tests.conftest import ROOT


async def test_grpc_stream_one_document_per_token(flow):
    grpc_port, _ = flow
    docs = [d async for d in stream("the quick brown fox", port=grpc_port, max_tokens=12)]
    # one document per token, unless this reader fell behind the tiny model: then a
    # document covers every token pending (token_ids); none is lost or repeated
    token_ids = [t for d in docs for t in d.token_ids]
    assert len(token_ids) == 12
    positions = [d.index - len(d.token_ids) + 1 + i for d in docs for i in range(len(d.token_ids))]
    assert positions == list(range(12))
    assert all(d.token_id == d.token_ids[-1] for d in docs)
    assert "".join(d.text for d in docs) == docs[-1].generated_text
    assert [d.finish_reason for d in docs[:-1]] == [None] * (len(docs) - 1)
    last = docs[-1]
    assert (last.finish_reason, last.generated_tokens) == ("length", 12)
    assert last.prompt_tokens > 0 and last.seed is None


async def test_grpc_greedy_is_deterministic_and_seeded_sampling_repeats(flow):
    grpc_port, _ = flow
    a = await generate("hello world", port=grpc_port, max_tokens=10)
    b = await generate("hello world", port=grpc_port, max_tokens=10)
    assert a.generated_text == b.generated_text
    s1 = await generate("hello world", port=grpc_port, max_tokens=10, do_sample=True, seed=7)
    s2 = await generate("hello world", port=grpc_port, max_tokens=10, do_sample=True, seed=7)
    assert s1.generated_text == s2.generated_text and s1.seed == 7


@pytest.mark.parametrize("field,value", [("prompt", ""), ("max_tokens", 0), ("max_tokens", 100000),
                                         ("temperature", -1.0), ("top_p", 1.5), ("top_k", -2)])
async def test_grpc_invalid_input_names_the_field(flow, field, value):
    grpc_port, _ = flow
    kwargs = {"max_tokens": 4, field: value}
    prompt = kwargs.pop("prompt", "hello")
    with pytest.raises(StreamError) as err:
        async for _ in stream(prompt, port=grpc_port, **kwargs):
            pass
    assert err.value.error_type == "validation"
    assert field in str(err.value)
    # the service keeps serving
    assert (await generate("hello", port=grpc_port, max_tokens=3)).finish_reason == "length"


async def test_grpc_calls_share_one_kept_channel(flow):
    """`connect`'s channel carries concurrent streams and outlives a refusal; `stream` leaves
    it open, and the answers equal those over a channel of their own."""
    grpc_port, _ = flow
    alone = [(await generate(p, port=grpc_port, max_tokens=8)).generated_text for p in ("hello", "a b c")]
    async with connect("127.0.0.1", grpc_port) as channel:
        shared = await asyncio.gather(*(generate(p, channel=channel, max_tokens=8) for p in ("hello", "a b c")))
        assert [d.generated_text for d in shared] == alone
        with pytest.raises(StreamError, match="top_p"):
            await generate("hello", channel=channel, max_tokens=4, top_p=1.5)
        assert (await generate("hello", channel=channel, max_tokens=8)).generated_text == alone[0]
    assert channel.get_state() == grpc.ChannelConnectivity.SHUTDOWN  # closed by `async with`, not by a call
    with pytest.raises(ValueError, match="channel"):  # it would be ignored there
        await generate("hello", channel=channel, protocol="http", port=grpc_port)


async def test_grpc_prompt_longer_than_context(flow):
    grpc_port, _ = flow
    with pytest.raises(StreamError, match="prompt"):
        await generate("word " * 2000, port=grpc_port, max_tokens=4)


async def test_http_sse_stream_matches_grpc(flow):
    grpc_port, http_port = flow
    ref = await generate("streams of tokens", port=grpc_port, max_tokens=8)
    body = {"prompt": "streams of tokens", "max_tokens": 8}
    with requests.get(f"http://127.0.0.1:{http_port}/stream", params=body, stream=True, timeout=60) as r:
        assert r.status_code == 200
        events = [json.loads(line[len("data: "):]) for line in r.iter_lines(decode_unicode=True)
                  if line.startswith("data: ") and line != "data: "]
    docs = [e for e in events if "text" in e]
    assert sum(len(d["token_ids"]) for d in docs) == 8
    assert "".join(d["text"] for d in docs) == ref.generated_text
    assert docs[-1]["finish_reason"] == "length"


async def test_unary_generate_endpoint(flow):
    grpc_port, _ = flow
    from docarray import DocList

    from client import make_client
    from schemas import ModelOutputDocument, PromptDocument
    ref = await generate("a lazy dog", port=grpc_port, max_tokens=6)
    c = make_client(port=grpc_port)
    docs = DocList[PromptDocument]([PromptDocument(prompt="a lazy dog", max_tokens=6),
                                    PromptDocument(prompt="", max_tokens=6)])
    out = [d async for d in c.post("/generate", docs, return_type=DocList[ModelOutputDocument])]
    result = out[0] if isinstance(out[0], DocList) else out
    assert result[0].generated_text == ref.generated_text == result[0].text
    assert result[0].token_ids and len(result[0].token_ids) == 6
    assert result[1].error_type == "validation" and "prompt" in result[1].error


def test_cli_streams_over_grpc_and_http(flow):
    """gRPC on --port; Jina SSE on the port in LLM_HTTP_PORT, as `make serve` reads it."""
    grpc_port, http_port = flow
    env = {**os.environ, "LLM_GRPC_PORT": "1", "LLM_HTTP_PORT": str(http_port)}
    for protocol, port in (("grpc", ["--port", str(grpc_port)]), ("http", [])):
        run = subprocess.run([sys.executable, "-m", "client", "hello world", "--max-tokens", "5",
                              "--protocol", protocol, *port], env=env,
                             cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        assert "finish_reason=length" in run.stderr and "generated_tokens=5" in run.stderr
    bad = subprocess.run([sys.executable, "-m", "client", "hello", "--top-p", "2", "--do-sample",
                          "--port", str(grpc_port)], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 2 and "top_p" in bad.stderr


async def _stats(port: int) -> dict:
    from docarray import DocList

    from client import make_client
    from schemas import ModelOutputDocument, PromptDocument
    c = make_client(port=port)
    async for resp in c.post("/stats", DocList[PromptDocument]([PromptDocument()]),
                             return_type=DocList[ModelOutputDocument]):
        docs = resp if isinstance(resp, DocList) else [resp]
        return json.loads(docs[0].text)


async def test_grpc_client_cancel_aborts_the_generation(slow_flow):
    import asyncio
    grpc_port, _ = slow_flow
    before = await _stats(grpc_port)
    got = []

    async def consume():
        async for doc in stream("hello", port=grpc_port, max_tokens=900):
            got.append(doc)
    task = asyncio.create_task(consume())
    while len(got) < 2:
        await asyncio.sleep(0.01)
    task.cancel()
    for _ in range(100):
        stats = await _stats(grpc_port)
        if stats["aborted"] > before["aborted"] and stats["running"] == 0:
            break
        await asyncio.sleep(0.1)
    assert stats["aborted"] == before["aborted"] + 1, stats
    assert stats["running"] == 0 and stats["running"] == 0 and stats["kv_blocks_used"] == 0
