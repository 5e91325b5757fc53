"""A real Flow (`jina flow --uses flows/llm.yml`, as `make serve` runs it) on random ports:
what the tests, the deployment comparison and the benchmarks start."""
import os
import time
import urllib.request
from pathlib import Path

from deploy.jina_cli import command as jina_command
from testing.procs import ROOT, ServerProcess, free_port

# starts on fresh random ports where one of them was taken between being picked and being bound
# (another test's process, an outgoing connection: they share the ephemeral range)
PORT_TRIES = 3
PORT_TAKEN = ("address already in use", "PortAlreadyUsed")  # the bind's error; Jina's own check before it


def start_flow(model: str, tmp_path: Path, executor: dict | None = None, env: dict | None = None,
               embeddings: bool = False, models: list[str] | None = None, **limits) -> tuple[ServerProcess, int, int]:
    """`jina flow --uses flows/llm.yml` as `make serve` runs it, on random ports; `limits`
    (max_running=..., ...) go to a copy of the flow file, `executor` replaces fields of its
    executor (another `uses`, say), the gateway unchanged; `env` adds to the environment. The
    embedding executor runs only with `embeddings` (a process less to start for the others).
    `models`: several, as LLM_MODELS has `make serve` run them (`model` is then unused)."""
    flow_file = "flows/llm.yml"
    if limits or executor or not embeddings:
        import yaml
        flow = yaml.safe_load((ROOT / flow_file).read_text())
        flow["executors"][0].setdefault("uses_with", {}).update(limits)
        flow["executors"][0].update(executor or {})
        if not embeddings:
            flow["executors"] = [e for e in flow["executors"] if e["name"] != "embedder"]
        flow_file = str(tmp_path / "flow_variant.yml")
        Path(flow_file).write_text(yaml.safe_dump(flow, sort_keys=False))
    for attempt in range(1, PORT_TRIES + 1):
        grpc_port, http_port = free_port(), free_port()
        # the models stay loaded (LLM_KEEP_ALIVE -1): a Flow shared by the whole run serves tests minutes
        # apart; a test that unloads a model asks for it (a request's keep_alive)
        flow_env = {"LLM_REPLICAS": "1", "LLM_KEEP_ALIVE": "-1", **os.environ, "LLM_MODEL": model,
                    "LLM_GRPC_PORT": str(grpc_port), "LLM_HTTP_PORT": str(http_port), "JINA_LOG_LEVEL": "INFO",
                    **(env or {})}
        from deploy.flow_models import write_flow  # the ports and replicas as `make serve` applies them
        written = write_flow(str(ROOT / flow_file), models or [], tmp_path / "flow.yml", flow_env)
        server = ServerProcess([*jina_command(), "flow", "--uses", written], tmp_path / "flow.log", flow_env)
        try:
            server.wait_port(grpc_port, 120)
            server.wait_port(http_port, 120)
            _wait_ready(server, http_port)
            return server, grpc_port, http_port
        except Exception:
            server.stop()
            log = server.tail(4000)
            if not any(sign in log for sign in PORT_TAKEN) or attempt == PORT_TRIES:
                raise RuntimeError("flow did not start:\n" + log) from None
    raise AssertionError("unreachable")


def _wait_ready(server: ServerProcess, http_port: int, timeout: float = 120.0) -> None:
    """Until the gateway answers; a Flow that exited meanwhile (its port taken, say) fails at once."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        server.check_alive()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError("flow not ready")
