"""Part of `make image-test`: the containers' greedy answer, over gRPC and over OpenAI SSE,
must equal the answer of the same Flow run as `make serve` runs it.

    python deploy/compare.py --containers GRPC_PORT HTTP_PORT
"""
import argparse
import asyncio
import json
import os
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from client import generate  # noqa: E402
from testing.flows import start_flow  # noqa: E402

QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]


def wait_ready(http_port: int, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/health", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            if time.time() > deadline:
                raise
        time.sleep(1)


def openai_sse(http_port: int) -> str:
    body = json.dumps({"messages": QUESTION, "max_tokens": 32, "temperature": 0,
                       "stream": True}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{http_port}/v1/chat/completions", body,
                                 {"Content-Type": "application/json"})
    text = ""
    with urllib.request.urlopen(req, timeout=120) as r:
        for line in r:
            line = line.decode().strip()
            if line.startswith("data: {"):
                text += json.loads(line[6:])["choices"][0]["delta"].get("content", "")
    return text


def answers(grpc_port: int, http_port: int) -> dict[str, str]:
    grpc = asyncio.run(generate("", port=grpc_port, max_tokens=32, messages=QUESTION)).generated_text
    return {"grpc": grpc, "openai-sse": openai_sse(http_port)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--containers", nargs=2, type=int, metavar=("GRPC_PORT", "HTTP_PORT"), required=True)
    args = parser.parse_args()
    wait_ready(args.containers[1])
    containers = answers(*args.containers)
    model = os.environ.get("LLM_MODEL", str(ROOT / "models" / "SmolLM2-135M-Instruct"))
    server, grpc_port, http_port = start_flow(model, Path("/tmp"))
    try:
        local = answers(grpc_port, http_port)
    finally:
        server.stop()
    print(f"containers: {containers}\nmake serve: {local}")
    if not (containers["grpc"] == containers["openai-sse"] == local["grpc"] == local["openai-sse"] != ""):
        sys.exit("the containers' answer differs from make serve's")


if __name__ == "__main__":
    main()
