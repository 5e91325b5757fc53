"""A bounded soak: a few hundred mixed requests on every protocol at once, with random
parameters, some cancelled mid-stream. Every answer equals the same request run alone (a
cancelled one is a prefix of it), no stream repeats a token, and afterwards the batch is
empty: no stuck slot, no reservation left. LLM_SOAK_REQUESTS sets the count (`make soak`)."""
import asyncio
import json
import os
import random
from dataclasses import dataclass, field
from typing import Optional

import aiohttp
import websockets

from client import stream
from tests.gateway_helpers import busy, stats, wait_until

REQUESTS = int(os.environ.get("LLM_SOAK_REQUESTS", "240"))
CONCURRENCY = 16
WORDS = "the quick brown fox jumps over a lazy dog while streams of tokens flow".split()
PROTOCOLS = ("grpc", "jina-sse", "openai", "openai-stream", "tgi", "tgi-stream", "websocket")


@dataclass
class Spec:
    """One request, in PromptDocument's terms; each protocol sends its own spelling of it."""

    protocol: str
    prompt: str
    max_tokens: int
    do_sample: bool
    temperature: float
    top_p: float
    seed: Optional[int]
    stop: list[str]
    cancel_after: Optional[int]  # leave after this many streamed events
    text: str = ""
    indexes: list[int] = field(default_factory=list)
    cancelled: bool = False

    def document_fields(self) -> dict:
        fields = dict(max_tokens=self.max_tokens, do_sample=self.do_sample, stop=self.stop)
        if self.do_sample:
            fields.update(temperature=self.temperature, top_p=self.top_p, seed=self.seed)
        return fields


def make_spec(rng: random.Random) -> Spec:
    protocol = rng.choice(PROTOCOLS)
    sample = rng.random() < 0.5
    streaming = protocol in ("grpc", "jina-sse", "openai-stream", "tgi-stream", "websocket")
    return Spec(protocol, " ".join(rng.choices(WORDS, k=rng.randint(1, 12))), rng.randint(1, 40), sample,
                round(rng.uniform(0.5, 1.5), 2), rng.choice([1.0, 0.9]), rng.getrandbits(64) if sample else None,
                [rng.choice(WORDS)] if rng.random() < 0.3 else [],
                rng.randint(1, 3) if streaming and rng.random() < 0.2 else None)


async def run(spec: Spec, session: aiohttp.ClientSession, ports: tuple[int, int]) -> None:
    grpc_port, http_port = ports
    base = f"http://127.0.0.1:{http_port}"
    events = _events(spec, session, base, grpc_port, http_port)
    try:
        n = 0
        async for text, index in events:
            spec.text, n = spec.text + text, n + 1
            if index is not None:
                spec.indexes.append(index)
            if spec.cancel_after is not None and n >= spec.cancel_after:
                spec.cancelled = True
                return
    finally:
        await events.aclose()


async def _events(spec: Spec, session, base: str, grpc_port: int, http_port: int):
    """(text, token index or None) per streamed event, for each protocol."""
    p, fields = spec.protocol, spec.document_fields()
    if p == "grpc":
        async for d in stream(spec.prompt, port=grpc_port, **fields):
            for i, _ in enumerate(d.token_ids):
                yield (d.text if i == len(d.token_ids) - 1 else ""), d.index - len(d.token_ids) + 1 + i
    elif p == "jina-sse":
        async with session.get(f"{base}/stream", json={"prompt": spec.prompt, **fields}) as r:
            async for data in _sse(r):
                yield data["text"], data["index"]
    elif p.startswith("openai"):
        body = {"prompt": spec.prompt, "max_tokens": spec.max_tokens, "stop": spec.stop,
                "temperature": spec.temperature if spec.do_sample else 0, "stream": p == "openai-stream"}
        if spec.do_sample:
            body.update(top_p=spec.top_p, seed=spec.seed)
        async with session.post(f"{base}/v1/completions", json=body) as r:
            if p == "openai":
                yield (await r.json())["choices"][0]["text"], None
            else:
                async for data in _sse(r):
                    yield data["choices"][0]["text"], None
    elif p.startswith("tgi"):
        params = {"max_new_tokens": spec.max_tokens, "do_sample": spec.do_sample, "stop": spec.stop}
        if spec.do_sample:
            params.update(temperature=spec.temperature, top_p=spec.top_p, seed=spec.seed)
        path = "/generate_stream" if p == "tgi-stream" else "/generate"
        async with session.post(base + path, json={"inputs": spec.prompt, "parameters": params}) as r:
            if p == "tgi":
                yield (await r.json())["generated_text"], None
            else:
                async for data in _sse(r):
                    yield data["token"]["text"], data["index"] - 1
    else:
        async with websockets.connect(f"ws://127.0.0.1:{http_port}/chat") as ws:
            await ws.send(json.dumps({"prompt": spec.prompt, **fields}))
            while (event := json.loads(await ws.recv()))["type"] == "token":
                yield event["text"], None
            assert event["type"] == "end", event


async def _sse(response: aiohttp.ClientResponse):
    assert response.status == 200, await response.text()
    async for raw in response.content:
        line = raw.decode().strip()
        if line.startswith("data:") and line[5:].strip() not in ("", "[DONE]"):
            data = json.loads(line[5:])
            assert "error" not in data or not data["error"], data
            yield data


async def alone(spec: Spec, grpc_port: int) -> str:
    """The same request, alone, over gRPC (WebSocket prompts go through the chat path)."""
    fields = spec.document_fields()
    if spec.protocol == "websocket":
        fields["messages"] = [{"role": "user", "content": spec.prompt}]
    text = ""
    async for doc in stream(spec.prompt, port=grpc_port, **fields):
        text = doc.generated_text
    return text


async def test_mixed_requests_with_cancellations_match_solo_runs(flow):
    grpc_port, http_port = flow
    rng = random.Random(20261122)
    specs = [make_spec(rng) for _ in range(REQUESTS)]
    queue: asyncio.Queue = asyncio.Queue()
    for spec in specs:
        queue.put_nowait(spec)

    async def worker(session: aiohttp.ClientSession) -> None:
        while not queue.empty():
            await run(queue.get_nowait(), session, flow)

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(worker(session) for _ in range(CONCURRENCY)))
    after = await asyncio.to_thread(wait_until, http_port, lambda s: busy(s) == 0, 10.0)
    assert busy(after) == 0 and after["kv_blocks_used"] == 0 and after["running"] == 0, after
    cancelled = 0
    for spec in specs:
        expected = await alone(spec, grpc_port)
        assert spec.indexes == sorted(set(spec.indexes)), spec  # no token twice
        if spec.cancelled:
            cancelled += 1
            assert expected.startswith(spec.text), spec
        else:
            assert spec.text == expected, spec
    assert cancelled >= REQUESTS // 20  # the mix did cancel some
    final = await asyncio.to_thread(stats, http_port)
    assert busy(final) == 0 and final["kv_blocks_used"] == 0
