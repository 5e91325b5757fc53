"""Helpers for the gateway tests: a slow model, a Flow with small limits, SSE and /stats readers.

The tiny test model answers 900 tokens in about a second, too fast to watch a
cancellation; the slow model (GPT-2 small's shape, random weights, tiny vocabulary)
takes about 20 ms per token on 2 cores, so an uncancelled 900-token request would
run for 15 s or more.
"""
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import requests
import yaml

from tests.conftest import ROOT, ServerProcess, _wait_ready, free_port, wait_for_port


def build_slow_model(path: Path) -> str:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from executors.engine.toy_models import bpe_tokenizer
    torch.manual_seed(0)
    tok = bpe_tokenizer()
    config = GPT2Config(vocab_size=len(tok), n_positions=1024, n_embd=768, n_layer=12, n_head=12,
                        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                        initializer_range=0.2)
    model = GPT2LMHeadModel(config)
    model.generation_config.pad_token_id = tok.eos_token_id
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def start_flow_with_limits(model: str, tmp_path: Path, **uses_with) -> tuple[ServerProcess, int, int]:
    """flows/llm.yml as shipped (same gateway), with other batching limits for the executor."""
    flow = yaml.safe_load((ROOT / "flows" / "llm.yml").read_text())
    flow["executors"][0].setdefault("uses_with", {}).update(uses_with)
    yml = tmp_path / "flow.yml"
    yml.write_text(yaml.safe_dump(flow, sort_keys=False))
    grpc_port, http_port = free_port(), free_port()
    env = dict(os.environ, LLM_MODEL=model, LLM_GRPC_PORT=str(grpc_port),
               LLM_HTTP_PORT=str(http_port), JINA_LOG_LEVEL="INFO")
    jina = str(Path(sys.executable).parent / "jina")
    server = ServerProcess([jina, "flow", "--uses", str(yml)], env, tmp_path / "flow.log")
    try:
        wait_for_port(grpc_port, server.proc)
        wait_for_port(http_port, server.proc)
        _wait_ready(http_port)
    except Exception:
        server.stop()
        raise RuntimeError("flow did not start:\n" + server.log()[-4000:])
    return server, grpc_port, http_port


def stats(http_port: int) -> dict:
    """The executor's /stats (Jina's HTTP route for a unary endpoint)."""
    r = requests.post(f"http://127.0.0.1:{http_port}/stats", json={"data": [{}]}, timeout=30)
    r.raise_for_status()
    return json.loads(r.json()["data"][0]["text"])


def busy(s: dict) -> int:
    return s["running"] + s["prefilling"] + s["waiting"]


def wait_until(http_port: int, predicate, timeout: float = 8.0) -> dict:
    deadline = time.time() + timeout
    while True:
        s = stats(http_port)
        if predicate(s) or time.time() > deadline:
            return s
        time.sleep(0.1)


def sse_data(lines: Iterator[str]) -> Iterator[dict | str]:
    """Payloads of `data:` lines (JSON decoded, '[DONE]' as is)."""
    for line in lines:
        if line.startswith("data:"):
            payload = line[len("data:"):].strip()
            if payload:
                yield payload if payload == "[DONE]" else json.loads(payload)


def curl_sse(url: str, body: dict, timeout: float = 60) -> list[dict | str]:
    """`curl -N URL -X POST -d BODY -H 'Content-Type: application/json'`, as the docs show it."""
    run = subprocess.run(["curl", "-sS", "-N", url, "-X", "POST", "-d", json.dumps(body),
                          "-H", "Content-Type: application/json"],
                         capture_output=True, text=True, timeout=timeout)
    assert run.returncode == 0, run.stderr
    return list(sse_data(run.stdout.splitlines()))
