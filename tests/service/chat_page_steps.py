"""The chat page tests' steps: what a user does on the page (ask, start a long answer, read what
is shown), the screenshots kept of it, and the scripts run in the page to check it."""
import os
from pathlib import Path

import requests

from tests.gateway_helpers import set_fields

from ..conftest import ROOT

ARTIFACTS = Path(os.environ.get("LLM_TEST_ARTIFACTS", ROOT / "test-artifacts")) / "chat-page"
HOSTILE = ('<img src=x onerror="window.pwned=1"> **bold** and *em* and `<b>code</b>`\n'
           '<script>window.pwned=2</script>\n\n- one\n- [two](javascript:window.pwned=3)\n'
           '1. [three](https://example.com)\n\n```python\n<i>raw</i> = 1\n```\n\n'
           '| a | b |\n|---|---|\n| 1 | 2 |\n\n> quoted\n\n2 * 3 * 4 ![pic](https://example.com/x.png)')
IDLE = 120000  # ms: an answer of the real model, on a loaded machine
LONG_STORY = "Write a long story about a dragon who learns to bake bread."
# what the page sends on its socket, kept in window.sent
RECORD_SENT = "() => { window.sent = []; const send = socket.send.bind(socket); socket.send = (m) => { sent.push(m); send(m); }; }"
# which of the header's title, the prompt's placeholder and the model dropdown's name are cut
CUT_LABELS = """() => {
    const cut = [], ruler = document.createElement("canvas").getContext("2d");
    const room = (el) => { const s = getComputedStyle(el);
        return el.clientWidth - parseFloat(s.paddingLeft) - parseFloat(s.paddingRight); };
    const needs = (el, text) => { ruler.font = getComputedStyle(el).font; return ruler.measureText(text).width; };
    for (const el of [document.querySelector("header h1"), ...document.querySelectorAll("header h1 span")]) {
        if (getComputedStyle(el).display !== "inline" && el.scrollWidth > el.clientWidth) cut.push(el.textContent);
    }
    const prompt = document.getElementById("prompt");
    if (needs(prompt, prompt.placeholder) > room(prompt)) cut.push(prompt.placeholder);
    const select = document.getElementById("setting-model"), name = select.selectedOptions[0].text;
    if (needs(select, name) > room(select) - 24) cut.push(name);  // 24 px: the dropdown's arrow
    return cut;
}"""


def shot(page, name: str) -> None:
    """The page as it is now, kept; `answered` is also the docs' picture with LLM_WRITE_EXAMPLES=1."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"))
    if name == "answered" and os.environ.get("LLM_WRITE_EXAMPLES"):
        page.screenshot(path=str(ROOT / "docs" / "chat-ui.png"))


def reference(http_port: int, messages: list[dict], max_tokens: int) -> dict:
    return requests.post(f"http://127.0.0.1:{http_port}/v1/chat/completions", timeout=120, json={
        "messages": messages, "max_tokens": max_tokens, "temperature": 0}).json()["choices"][0]


def send(page, text: str) -> None:
    from playwright.sync_api import expect
    page.fill("#prompt", text)
    page.press("#prompt", "Enter")
    expect(page.locator("body")).to_have_attribute("data-state", "idle", timeout=IDLE)


def start_long_answer(page, text: str) -> str:
    """Ask for a long answer and wait for its first words; the id of its conversation."""
    from playwright.sync_api import expect
    set_fields(page, temperature=0, max_tokens=600)
    page.fill("#prompt", text)
    page.press("#prompt", "Enter")
    expect(page.locator("body")).to_have_attribute("data-state", "generating")
    page.wait_for_function("() => (document.querySelector('.message.assistant:last-child')?.dataset.text || '')"
                           ".length > 10", timeout=IDLE)
    return page.evaluate("current.id")


def shown(page) -> list[str]:
    return [page.locator(".message").nth(i).text_content() for i in range(page.locator(".message").count())]


def settings_of(http_port: int) -> dict:
    return requests.get(f"http://127.0.0.1:{http_port}/chat-ui/settings", timeout=60).json()
