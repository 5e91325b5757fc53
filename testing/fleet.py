"""The multi-host shape on one machine: N `jina executor` processes (the replicas) and one
`jina gateway` that knows their addresses, as deploy/docker-compose.yml and the Kubernetes
manifests run them. Unlike a Flow's replicas, each can be killed, stopped and started again on
its own port: what the migration, drain and rolling-restart tests need."""
import json
import os
import signal
import time
import urllib.request
from pathlib import Path
from typing import Optional

from deploy.jina_cli import command as jina_command
from gateway.fleet.channels import PING_POLICY
from testing.procs import ServerProcess, free_port

GRAPH = json.dumps({"start-gateway": ["llm"], "llm": ["end-gateway"]})


class LocalFleet:
    def __init__(self, model: str, tmp: Path, replicas: int = 2, env: Optional[dict] = None):
        self.model, self.tmp = model, tmp
        self.env = {**os.environ, "LLM_MODEL": model, "JINA_LOG_LEVEL": "INFO", **(env or {})}
        self.ports = [free_port() for _ in range(replicas)]
        self.executors: list[Optional[ServerProcess]] = [None] * replicas
        self.grpc_port, self.http_port = free_port(), free_port()
        self.gateway: Optional[ServerProcess] = None
        self.starts = [0] * replicas

    def __enter__(self) -> "LocalFleet":
        try:
            for i in range(len(self.ports)):
                self.start(i, wait=False)
            self._start_gateway()
            for i in range(len(self.ports)):
                self.wait_executor(i)
            self.wait_routable(len(self.ports))
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, i: int, wait: bool = True) -> None:
        """Replica i, on its own port (again, after a kill or a stop)."""
        self.starts[i] += 1
        cmd = [*jina_command(), "executor", "--uses", "jina.yml", "--port", str(self.ports[i]), "--host", "127.0.0.1",
               "--grpc-server-options", json.dumps(PING_POLICY)]  # as the Flow's executors (flows/llm.yml)
        self.executors[i] = ServerProcess(cmd, self.tmp / f"executor-{i}-{self.starts[i]}.log", self.env)
        if wait:
            self.wait_executor(i)

    def wait_executor(self, i: int, timeout: float = 120.0) -> None:
        process = self.executors[i]
        assert process is not None
        process.wait_port(self.ports[i], timeout)

    def signal(self, i: int, sig: signal.Signals) -> None:
        process = self.executors[i]
        assert process is not None
        os.killpg(process.proc.pid, sig)

    def wait_exit(self, i: int, timeout: float = 60.0) -> Optional[int]:
        process = self.executors[i]
        assert process is not None
        try:
            return process.proc.wait(timeout)
        finally:
            process.stop()

    def _start_gateway(self) -> None:
        addresses = json.dumps({"llm": [f"grpc://127.0.0.1:{port}" for port in self.ports]})
        cmd = [*jina_command(), "gateway", "--uses", "gateway/gateway.yml", "--protocol", "grpc", "http",
               "--port", str(self.grpc_port), str(self.http_port), "--graph-description", GRAPH,
               "--deployments-addresses", addresses]
        self.gateway = ServerProcess(cmd, self.tmp / "gateway.log", self.env)
        self.gateway.wait_port(self.grpc_port, 120)
        self.gateway.wait_port(self.http_port, 120)

    def stats(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/stats", timeout=30) as r:
            return json.loads(r.read())

    def wait_routable(self, replicas: int, timeout: float = 120.0) -> None:
        """Until the gateway's router sees `replicas` replicas that take work."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if sum(r.get("reachable", False) for r in self.stats()["replicas"]) >= replicas:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"{replicas} replicas not routable:\n{self.gateway.tail() if self.gateway else ''}")

    def stop(self) -> None:
        for process in [self.gateway, *self.executors]:
            if process is not None:
                process.stop()
