"""Whether an executor on this machine listens yet, read off the kernel's socket tables: no try.

At its start Jina's gateway asks every executor for its endpoints, and retries each second while
they load their models. gRPC also backs each failed connection off (up to 1 s: gateway/fleet/
channels.py). So the gateway reached an executor 1 to 2 s after it listened: a fifth of `make
serve`'s start. Trying every few milliseconds instead would find it sooner, but a try to a port
that nothing listens on can connect to itself (a TCP simultaneous open, when the port lies in the
ephemeral range) and hold the very port the executor is about to bind.

Linux lists every listening socket of the network namespace in /proc/net/tcp and tcp6. So the
gateway waits, reading those every 20 ms, until each executor on this machine listens, and then
makes its first try, which finds the executor serving. An address on another machine (Kubernetes,
compose), or a system without those tables, leaves Jina's retries as they are; so does a wait past
`WAIT_LIMIT_S`, in case the port is reached some other way (a forwarder in another namespace).
"""
import asyncio
import ipaddress
import time
from collections.abc import Callable
from typing import Optional

TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
LISTEN = "0A"  # the kernel's TCP_LISTEN state, as the tables write it
POLL_S = 0.02
WAIT_LIMIT_S = 600.0  # an 8B model loads in a minute or two; past this, Jina's own retries


def listening_ports(tables: tuple[str, ...] = TABLES) -> Optional[set[int]]:
    """Every port that a socket of this network namespace listens on; None when no table reads."""
    ports: set[int] = set()
    read = False
    for table in tables:
        try:
            with open(table) as lines:
                next(lines, None)  # the header
                for line in lines:
                    fields = line.split()
                    if len(fields) > 3 and fields[3] == LISTEN:
                        ports.add(int(fields[1].rsplit(":", 1)[1], 16))
        except OSError:
            continue
        read = True
    return ports if read else None


def local_port(address: str) -> Optional[int]:
    """The port of `address` (host:port, a scheme allowed) when its host is this machine's
    loopback or any-address, as a local Flow's are; None for another host's, or an unclear one."""
    host, _, port = address.split("://", 1)[-1].rpartition(":")
    host = host.strip("[]")
    if not port.isdigit():
        return None
    if host == "localhost":
        return int(port)
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    return int(port) if ip.is_loopback or ip.is_unspecified else None


def reachable(deployments: list[list[str]], ports: set[int]) -> bool:
    """Whether each deployment (its replicas' addresses) may be tried: one of them is on another
    machine (no table tells), or listens here."""
    return all(any(local_port(a) is None or local_port(a) in ports for a in addresses)
               for addresses in deployments if addresses)


async def until_listening(deployments: list[list[str]], cancelled: Optional[asyncio.Event] = None,
                          limit_s: float = WAIT_LIMIT_S, waiting: Callable[[], None] = lambda: None) -> bool:
    """Wait until every deployment may be tried (`reachable`); `waiting` is called once if that
    takes a wait. False when that cannot be known (no table), at the limit, or when `cancelled` is
    set: the caller then tries as before."""
    deadline = time.monotonic() + limit_s
    said = False
    while True:
        ports = listening_ports()
        if ports is None:
            return False
        if reachable(deployments, ports):
            return True
        if time.monotonic() >= deadline or (cancelled is not None and cancelled.is_set()):
            return False
        if not said:
            waiting()
            said = True
        await asyncio.sleep(POLL_S)
