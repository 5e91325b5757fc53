"""Helpers for the gateway tests: SSE and /stats readers."""
import contextlib
import json
import os
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import psutil
import pytest
import requests

CHROMIUM = "/usr/bin/chromium"
# as root, offline: no sandbox, and none of Chromium's own network traffic
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
needs_chromium = pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=(
    f"{CHROMIUM} is absent: apt-get install -y chromium (the Debian package; .ci/run installs it)"))


@contextlib.contextmanager
def chat_page(url: str, width: int = 1280, height: int = 800) -> Iterator[Any]:
    """The chat page at `url` in headless Chromium (a fresh profile, allowed the clipboard),
    once its WebSocket is connected."""
    from playwright.sync_api import expect, sync_playwright
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": width, "height": height},
                                          permissions=["clipboard-read", "clipboard-write"])
            page = context.new_page()
            page.goto(url)
            expect(page.locator("#status")).to_have_text("connected", timeout=15000)
            yield page
        finally:
            browser.close()


def set_fields(page: Any, system: str | None = None, **fields: Any) -> None:
    """Fill the chat page's settings (each request field's input, and the system prompt)."""
    page.click("#settings-toggle")
    page.wait_for_selector("#setting-max_tokens")  # built from /chat-ui/settings
    for name, value in fields.items():
        page.fill(f"#setting-{name}", str(value))
    if system is not None:
        page.fill("#system-prompt", system)
    page.click("#settings-toggle")


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


def listening(proc: psutil.Process) -> set[tuple[str, int]]:
    """(address, port) of each TCP socket the process listens on; none once it is gone."""
    try:
        return {(c.laddr.ip, c.laddr.port) for c in proc.net_connections("tcp") if c.status == psutil.CONN_LISTEN}
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return set()


def executor_process(http_port: int) -> psutil.Process:
    """A Flow's executor: the child of the Flow that listens, but not on the gateway's port."""
    gateway = next(p for p in psutil.process_iter() if any(port == http_port for _, port in listening(p)))
    return next(c for c in gateway.parent().children() if c.pid != gateway.pid and listening(c))


def engine_processes(http_port: int) -> list[psutil.Process]:
    """A Flow's engine processes: those its executors started, and the one that `make serve`'s
    launcher started ahead, the Flow's own child, which an executor claimed
    (engine/core/ahead_process.py)."""
    gateway = next(p for p in psutil.process_iter() if any(port == http_port for _, port in listening(p)))
    return [p for p in gateway.parent().children(recursive=True) if "engine.core." in " ".join(p.cmdline())]
