"""Whether an executor on this machine listens yet, read off the kernel's socket tables: no try.

At its start Jina's gateway asks every executor for its endpoints, and retries each second while
they load their models. gRPC also backs each failed connection off (up to 1 s: gateway/fleet/
channels.py). So the gateway reached an executor 1 to 2 s after it listened: a fifth of `make
serve`'s start. Trying every few milliseconds instead would find it sooner, but a try to a port
that nothing listens on can connect to itself (a TCP simultaneous open, when the port lies in the
ephemeral range) and hold the very port the executor is about to bind.

Linux lists every listening socket of the network namespace. So the gateway waits, asking every
20 ms, until each executor on this machine listens, and then makes its first try, which finds the
executor serving. It asks the kernel's socket diagnostics over netlink (`ss`'s way) for the
listening sockets alone: 0.05 ms a question. /proc/net/tcp and tcp6 say the same, but the kernel
writes them by walking its whole table of connections (3 ms of CPU for both on this project's
machine, a sixth of a core at this rate, while the engine loads beside it); they remain the answer
where netlink is refused. An address on another machine (Kubernetes, compose), or a system where
neither answers, leaves Jina's retries as they are; so does a wait past `WAIT_LIMIT_S`, in case the
port is reached some other way (a forwarder in another namespace).
"""
import asyncio
import ipaddress
import socket
import struct
import time
from collections.abc import Callable
from typing import Optional

TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
LISTEN = "0A"  # the kernel's TCP_LISTEN state, as the tables write it
POLL_S = 0.02
WAIT_LIMIT_S = 600.0  # an 8B model loads in a minute or two; past this, Jina's own retries


_NETLINK_SOCK_DIAG = 4  # linux/netlink.h (the socket module does not name it)
_SOCK_DIAG_BY_FAMILY, _DUMP_REQUEST = 20, 0x1 | 0x300  # linux/sock_diag.h; NLM_F_REQUEST | NLM_F_DUMP
_DONE, _ERROR = 3, 2  # NLMSG_DONE, NLMSG_ERROR
_HEADER = struct.Struct("=IHHII")  # struct nlmsghdr
_REQUEST = struct.Struct("=BBBxI48x")  # struct inet_diag_req_v2: family, protocol, extensions, states, no socket id
_SPORT_AT = _HEADER.size + 4  # struct inet_diag_msg: family, state, timer, retrans, then the id's source port
_TCP_LISTEN = 10


def listening_ports(tables: tuple[str, ...] = TABLES) -> Optional[set[int]]:
    """Every port that a TCP socket of this network namespace listens on, from netlink, else from
    `tables`; None when neither answers."""
    ports = diagnosed_listening_ports()
    return ports if ports is not None else table_listening_ports(tables)


def diagnosed_listening_ports() -> Optional[set[int]]:
    """The listening TCP ports (IPv4 and IPv6) as the kernel's socket diagnostics list them; None
    where netlink is refused (not Linux, or a sandbox without it)."""
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as diag:
            diag.settimeout(1.0)  # the kernel answers at once; never a stalled gateway
            ports: set[int] = set()
            for family in (socket.AF_INET, socket.AF_INET6):
                body = _REQUEST.pack(family, socket.IPPROTO_TCP, 0, 1 << _TCP_LISTEN)
                diag.send(_HEADER.pack(_HEADER.size + len(body), _SOCK_DIAG_BY_FAMILY, _DUMP_REQUEST, family, 0) + body)
                if not _read_dump(diag, ports):
                    return None
            return ports
    except (OSError, AttributeError):  # a timeout too; AttributeError: no AF_NETLINK on this system
        return None


def _read_dump(diag: socket.socket, ports: set[int]) -> bool:
    """The listening ports of one dump's answers added to `ports`; False on the kernel's error."""
    while True:
        data = diag.recv(1 << 16)
        offset = 0
        while offset + _HEADER.size <= len(data):
            length, kind, _, _, _ = _HEADER.unpack_from(data, offset)
            if kind == _DONE:
                return True
            if kind == _ERROR or length < _HEADER.size:
                return False
            ports.add(struct.unpack_from(">H", data, offset + _SPORT_AT)[0])
            offset += (length + 3) & ~3  # NLMSG_ALIGN
        if not data:
            return False


def table_listening_ports(tables: tuple[str, ...] = TABLES) -> Optional[set[int]]:
    """Every port that a socket of this network namespace listens on, read off /proc's tables;
    None when no table reads."""
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
