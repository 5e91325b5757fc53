"""`make compose-test`: deploy/docker-compose.yml run under podman-compose, each executor replica a
host of its own on the compose network, the gateway routing between them; then, against the
containers: a conversation's later turns find their prefix cached (the router keeps them where it
is), and a stream whose replica container is killed goes on on the other with the same text. No
container is left behind.

    python deploy/compose_test.py [--tag TAG]   (the images localhost/llm-stream-*:TAG, built already)
"""
import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import yaml

ROOT = Path(__file__).resolve().parent.parent
PODMAN = ["podman", "--runtime", "runc", "--cgroup-manager", "cgroupfs"]
PROJECT = "llmcompose"
HTTP_PORT = 23446


def compose_file(tag: str, out: Path) -> Path:
    """deploy/docker-compose.yml with the local images, the model mounted, the gateway's HTTP port
    published, the limits this machine needs, and no health checks (podman runs them with systemd)."""
    spec: dict[str, Any] = yaml.safe_load((ROOT / "deploy" / "docker-compose.yml").read_text())
    for name, service in spec["services"].items():
        role = "gateway" if name == "gateway" else "executor"
        service["image"] = f"localhost/llm-stream-{role}:{tag}"
        service["ulimits"] = {"nofile": 4096, "nproc": 4096}
        service.pop("healthcheck", None)
        if role == "executor":
            service["volumes"] = [f"{ROOT / 'models'}:/models:ro"]
        else:
            service["ports"] = [f"127.0.0.1:{HTTP_PORT}:8081"]
    path = out / "compose.yml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def compose(path: Path, *args: str) -> None:
    cli = shutil.which("podman-compose") or str(Path(sys.executable).parent / "podman-compose")
    quiet([cli, "--podman-args", " ".join(PODMAN[1:]), "--podman-run-args", "--health-interval disable",
           "-p", PROJECT, "-f", str(path), *args])


def quiet(cmd: list[str]) -> None:
    """`cmd`, its output shown only when it fails: podman-compose's `down` says "Error: no container"
    for each container that is not there, and podman logs errors for the systemd timers of the
    images' HEALTHCHECKs, which this machine lacks (they are not run here), on every start."""
    run = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if run.returncode:
        sys.stderr.write(run.stderr)
        raise subprocess.CalledProcessError(run.returncode, cmd)


def get(path: str, timeout: float = 30) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{HTTP_PORT}{path}", timeout=timeout) as r:
        return json.loads(r.read())


def wait_routable(replicas: int, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if sum(r.get("reachable", False) for r in get("/stats")["replicas"]) >= replicas:
                return
        except OSError:
            pass
        time.sleep(2)
    raise TimeoutError(f"{replicas} replicas not routable in {timeout:.0f} s")


def post(path: str, body: dict, on_chunk: Optional[Callable[[int], None]] = None) -> Any:
    request = urllib.request.Request(f"http://127.0.0.1:{HTTP_PORT}{path}", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as r:
        if not body.get("stream"):
            return json.loads(r.read())
        text, chunks = "", 0
        for line in r:
            line = line.decode().strip()
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                assert "error" not in chunk, chunk
                text, chunks = text + chunk["choices"][0]["text"], chunks + 1
                if on_chunk is not None:
                    on_chunk(chunks)
        return text


def check_routing() -> None:
    messages = [{"role": "system", "content": "You guide visitors of the old harbour museum. " * 20}]
    previous = 0
    for turn in range(3):
        messages.append({"role": "user", "content": f"Question {turn}: what is in room {turn}?"})
        answer = post("/v1/chat/completions", {"messages": messages, "max_tokens": 16, "temperature": 0})
        usage = answer["usage"]
        cached = usage["prompt_tokens_details"]["cached_tokens"]
        assert not turn or cached >= (previous // 16 - 1) * 16, (turn, cached, previous)
        previous = usage["prompt_tokens"]
        messages.append({"role": "assistant", "content": answer["choices"][0]["message"]["content"]})
    print(f"routing: every later turn found its prefix cached (last: {cached} of {previous} tokens)")


def check_migration() -> None:
    body = {"prompt": "Once upon a time, in a harbour town,", "max_tokens": 300, "temperature": 0,
            "ignore_eos": True, "stream": True}
    unbroken = post("/v1/completions", body)
    killed: list[str] = []

    def kill(chunks: int) -> None:
        if chunks == 20 and not killed:
            replica = next(r for r in get("/stats")["replicas"] if r["streams"])
            service = replica["address"].split("//")[-1].split(":")[0]  # llm-rep-0
            killed.append(f"{PROJECT}_{service}_1")
            quiet([*PODMAN, "kill", killed[0]])
    broken = post("/v1/completions", body, kill)
    assert killed and broken == unbroken, (killed, broken[:200], unbroken[:200])
    print(f"migration: {killed[0]} killed mid-stream; the stream went on with the same {len(broken)} characters")
    quiet([*PODMAN, "start", killed[0]])
    wait_routable(2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tag", default="test")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = compose_file(args.tag, Path(tmp))
        compose(path, "down")
        try:
            compose(path, "up", "-d")
            wait_routable(2)
            print("compose: the gateway routes to 2 executor containers")
            check_routing()
            check_migration()
        finally:
            compose(path, "down")
    left = subprocess.run([*PODMAN, "ps", "-a", "-q", "--filter", f"name={PROJECT}"], capture_output=True,
                          text=True).stdout.split()
    assert not left, f"containers left: {left}"
    print("compose-test passed; no container left")
    return 0


if __name__ == "__main__":
    sys.exit(main())
