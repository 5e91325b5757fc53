"""The gateway's channels to the executors reconnect within about a second: an executor that
loads its model for a while, or a replica that restarts, is reached as soon as it listens, not
after gRPC's exponential backoff (several seconds after a start of 10 to 20 s)."""
import asyncio
import time
from types import SimpleNamespace

import grpc
from jina.serve.networking.utils import get_grpc_channel

from gateway.fleet.channels import RECONNECT_OPTIONS, bound_reconnects, channel_options
from gateway.fleet.membership import Membership
from testing.procs import free_port

LATE_S = 6.0  # long enough for gRPC's own backoff to have grown to 2.6 s, then 4.1 s


async def test_an_executor_that_listens_late_is_reached_within_a_second():
    """Tried as Jina's connection pool tries: a new channel each try, the failed ones still open
    (so that without a bound they share one subchannel and its backoff)."""
    port, servers = free_port(), []

    async def listen() -> None:  # the port is bound only now, as a loading executor binds it at the end
        servers.append(grpc.aio.server())
        servers[0].add_insecure_port(f"127.0.0.1:{port}")
        await servers[0].start()
    start = asyncio.get_running_loop().call_later(LATE_S, lambda: asyncio.ensure_future(listen()))
    began, opened = time.monotonic(), []
    try:
        while True:
            channel = get_grpc_channel(f"127.0.0.1:{port}", options=channel_options(), asyncio=True)
            opened.append(channel)
            try:
                await channel.unary_unary("/none.None/Nothing")(b"", timeout=0.5)
            except grpc.aio.AioRpcError as error:
                if error.code() == grpc.StatusCode.UNIMPLEMENTED:  # it answered
                    break
            await asyncio.sleep(0.1)
        reached = time.monotonic() - began
    finally:
        start.cancel()
        for channel in opened:
            await channel.close()
        for server in servers:
            await server.stop(None)
    # gRPC's own backoff reached it 2.3 to 4 s late here; the bound is a second, 20% jitter aside
    assert LATE_S <= reached < LATE_S + 1.6, f"reached {reached - LATE_S:.2f} s after it listened"


def test_the_flows_own_options_win_and_every_server_gets_the_bound():
    given = {"runtime_args": {"grpc_channel_options": {"grpc.max_reconnect_backoff_ms": 5000}}}
    bound_reconnects(given["runtime_args"])
    assert given["runtime_args"]["grpc_channel_options"] == {**RECONNECT_OPTIONS, "grpc.max_reconnect_backoff_ms": 5000}
    namespace = SimpleNamespace()
    bound_reconnects(namespace)
    assert namespace.grpc_channel_options == RECONNECT_OPTIONS


async def test_the_routers_replicas_reconnect_within_the_bound():
    """On an event loop, as the gateway makes them: gRPC's aio channels take the running loop
    (outside one, whichever loop an earlier test left set, or none)."""
    replica = Membership("llm", {}, ["127.0.0.1:1"]).initial()[0]
    assert replica.streamer._connection_pool.channel_options == RECONNECT_OPTIONS
