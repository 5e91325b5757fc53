"""How the gateway's gRPC channels to the executors reconnect.

gRPC backs a failed connection off exponentially (1 s, 1.6 s, 2.6 s, ... up to 120 s), and a
new channel to the same address shares the old one's subchannel, backoff and all. While an
executor loads its model (seconds to minutes) the gateway's every try fails, so without a bound
the gateway would first reach a ready executor up to several seconds after it was ready: in
Gemma's starts, 2 to 7 s of 19 to 27 s. The same wait follows a replica that restarts. On a
local or cluster network a try is cheap, so tries come every second at most (not faster: a try
to a port that nothing listens on can connect to itself, holding the port the executor is about
to bind, and more tries make that likelier). The options a Flow gives its gateway
(`grpc_channel_options`) win over these.

Jina's channels ping every 10 s, calls or none (`get_default_grpc_options`), and its servers meant
to allow that, but set the options under `grpc.http1.` names that gRPC does not read. So a server
keeps gRPC's defaults: a ping on a connection without calls is a strike, and after two it sends
GOAWAY "too_many_pings". An executor idle for 30 s thus dropped the gateway's connection, and a
call that met the GOAWAY failed with "Too many pings". `PING_POLICY` is what Jina meant, under the
names gRPC reads: the executors' servers (flows/llm.yml's `grpc_server_options`) and the gateway's
own take it."""
from typing import Any, Optional

from jina.serve.runtimes.gateway.streamer import GatewayStreamer

RECONNECT_OPTIONS = {"grpc.max_reconnect_backoff_ms": 1000}
# a server's side: a client's keepalive pings allowed without calls, up to one every 5 s
PING_POLICY = {"grpc.keepalive_permit_without_calls": 1, "grpc.http2.min_ping_interval_without_data_ms": 5000}


def channel_options(given: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """The reconnection bound, with what the Flow gave on top."""
    return {**RECONNECT_OPTIONS, **(given or {})}


def streamer(graph: dict, addresses: dict[str, list[str]], **kwargs: Any) -> GatewayStreamer:
    """A Jina streamer to these executors whose channels reconnect within the bound."""
    return GatewayStreamer(graph, addresses, grpc_channel_options=channel_options(), **kwargs)


def bound_reconnects(runtime_args: Any) -> None:
    """The bound in a gateway's runtime arguments (a dict or a namespace), for the channels that
    Jina's own streamers open."""
    if isinstance(runtime_args, dict):
        runtime_args["grpc_channel_options"] = channel_options(runtime_args.get("grpc_channel_options"))
    elif runtime_args is not None:
        runtime_args.grpc_channel_options = channel_options(getattr(runtime_args, "grpc_channel_options", None))
