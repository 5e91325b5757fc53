"""jina.yml as a Deployment (the Hub-style executor config), with small batching limits."""
import asyncio
import multiprocessing

import pytest
from jina import Deployment

from client import StreamError, generate, stream
from tests.conftest import ROOT, free_port


@pytest.fixture(scope="module")
def small_deployment(slow_model):
    """Its processes are spawned: forked, they would copy this process with the gRPC channels
    that earlier tests opened, and gRPC's threads in this process then crash."""
    previous = multiprocessing.get_start_method(allow_none=True)
    multiprocessing.set_start_method("spawn", force=True)
    try:
        port = free_port()
        dep = Deployment(uses=str(ROOT / "jina.yml"), protocol="grpc", port=port,
                         uses_with={"model": slow_model, "max_running": 1, "max_waiting": 1})
        with dep:
            yield port
    finally:
        multiprocessing.set_start_method(previous, force=True)


async def test_overloaded_beyond_limits_others_unaffected(small_deployment):
    port = small_deployment
    first, second = [], []

    async def consume(sink, max_tokens):
        async for doc in stream("hello", port=port, max_tokens=max_tokens):
            sink.append(doc)
    # long enough to outlast the checks below on a GPU too, where the slow model makes 9 ms tokens
    running = asyncio.create_task(consume(first, 150))
    while not first:
        await asyncio.sleep(0.01)
    waiting = asyncio.create_task(consume(second, 5))  # queued behind the running one
    await asyncio.sleep(0.5)
    with pytest.raises(StreamError) as err:  # no slot and no queue room: refused at once
        await generate("hello", port=port, max_tokens=5)
    assert err.value.error_type == "overloaded" and "overloaded" in str(err.value)
    await asyncio.gather(running, waiting)
    assert sum(len(d.token_ids) for d in first) == 150 and first[-1].finish_reason == "length"
    assert sum(len(d.token_ids) for d in second) == 5
    assert (await generate("hello", port=port, max_tokens=3)).generated_tokens == 3
