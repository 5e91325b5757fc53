"""Which replicas there are: the addresses Jina gives the gateway (a Flow's replicas, Docker
Compose's services), or, with `LLM_ROUTER_RESOLVE=1`, every address their host names resolve to,
looked up again every few seconds: a Kubernetes headless Service (`clusterIP: None`) names every
ready pod of the executor, so pods that come and go join and leave the router."""
import asyncio
import itertools
import logging
import socket
from typing import Any
from urllib.parse import urlsplit

from gateway.config import config
from gateway.fleet.channels import streamer as new_streamer
from gateway.fleet.replicas import Replica

log = logging.getLogger(__name__)


class Membership:
    def __init__(self, deployment: str, graph: dict, addresses: list[str], logger: Any = None):
        self.deployment, self.graph, self.addresses, self.logger = deployment, graph, addresses, logger
        self.resolve = config().resolve
        self._numbers = itertools.count()

    def replica(self, address: str) -> Replica:
        streamer = new_streamer(self.graph, {self.deployment: [address]}, retries=0, logger=self.logger)
        return Replica(next(self._numbers), address, streamer)

    def initial(self) -> list[Replica]:
        return [self.replica(address) for address in self.addresses]

    async def refresh(self, replicas: list[Replica]) -> None:
        """With resolving on: a replica for every address the names resolve to now (in place)."""
        if not self.resolve:
            return
        found: list[str] = []
        for address in self.addresses:
            found += await asyncio.to_thread(_resolved, address)
        if not found:  # a lookup that failed: keep what there is
            return
        for gone in [r for r in replicas if r.address not in found]:
            log.info("replica %d (%s) left", gone.index, gone.address)
            replicas.remove(gone)
            await gone.streamer.close()
        known = {r.address for r in replicas}
        for address in found:
            if address not in known:
                replicas.append(self.replica(address))
                log.info("replica %d (%s) joined", replicas[-1].index, address)


def _resolved(address: str) -> list[str]:
    """`grpc://name:port` as one address per IP that `name` resolves to (none if it does not)."""
    parts = urlsplit(address if "://" in address else f"grpc://{address}")
    try:
        infos = socket.getaddrinfo(parts.hostname or "", parts.port, type=socket.SOCK_STREAM)
    except OSError:
        return []
    ips = sorted({info[4][0] for info in infos})
    return [f"{parts.scheme}://{ip}:{parts.port}" for ip in ips]
