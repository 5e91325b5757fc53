"""How the gateway's gRPC channels to the executors reconnect.

gRPC backs a failed connection off exponentially (1 s, 1.6 s, 2.6 s, ... up to 120 s), and a
new channel to the same address shares the old one's subchannel, backoff and all. While an
executor loads its model (seconds to minutes) the gateway's every try fails, so without a bound
the gateway would first reach a ready executor up to several seconds after it was ready: in
Gemma's starts, 2 to 7 s of 19 to 27 s. The same wait follows a replica that restarts. On a
local or cluster network a try is cheap, so tries come every second at most. The options a Flow
gives its gateway (`grpc_channel_options`) win over these."""
import asyncio
from typing import Any, Optional
from urllib.parse import urlsplit

from jina.serve.runtimes.gateway.streamer import GatewayStreamer

RECONNECT_OPTIONS = {"grpc.initial_reconnect_backoff_ms": 100, "grpc.max_reconnect_backoff_ms": 1000,
                     "grpc.use_local_subchannel_pool": 1}


def channel_options(given: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """The reconnection bound, with what the Flow gave on top."""
    return {**RECONNECT_OPTIONS, **(given or {})}


def streamer(graph: dict, addresses: dict[str, list[str]], **kwargs: Any) -> GatewayStreamer:
    """A Jina streamer to these executors whose channels reconnect within the bound."""
    return GatewayStreamer(graph, addresses, grpc_channel_options=channel_options(), **kwargs)


async def listening(deployments: dict[str, list[str]], is_cancel: Any = None,
                    every_s: float = 0.05) -> None:
    """Until one replica of each deployment accepts a TCP connection (or the start is cancelled).
    Jina's gateway asks the executors for their endpoints once a second while they load; asked
    after this, its first ask is answered, up to a second sooner."""
    pending = {name: addresses for name, addresses in deployments.items() if addresses}
    while pending and not (is_cancel and is_cancel.is_set()):
        for name, addresses in list(pending.items()):
            if any([await _accepts(address) for address in addresses]):
                del pending[name]
        if pending:
            await asyncio.sleep(every_s)


async def _accepts(address: str) -> bool:
    parts = urlsplit(address if "://" in address else f"grpc://{address}")
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(parts.hostname, parts.port), 1.0)
    except (OSError, TimeoutError):
        return False
    writer.close()
    return True
