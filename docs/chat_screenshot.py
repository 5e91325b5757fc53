"""Screenshot of the chat page talking to a running service (`make serve`), for the README.

    .venv/bin/python docs/chat_screenshot.py [http://localhost:12346] [docs/chat-ui.png]
"""
import sys

from playwright.sync_api import expect, sync_playwright

sys.path.insert(0, ".")
from tests.gateway_helpers import CHROMIUM, CHROMIUM_ARGS  # noqa: E402

QUESTIONS = ["What is the capital of France?",
             "Write a Python function that greets someone, and explain it briefly."]


def main(base: str = "http://localhost:12346", out: str = "docs/chat-ui.png") -> None:
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 900, "height": 540})
        page.goto(f"{base}/chat-ui")
        expect(page.locator("#status")).to_have_text("connected", timeout=15000)
        for question in QUESTIONS:
            page.fill("#prompt", question)
            page.click("#send")
            expect(page.locator("body")).to_have_attribute("data-state", "idle", timeout=120000)
        page.add_style_tag(content="#log { height: auto !important; }")  # the whole conversation
        page.screenshot(path=out, full_page=True)
        print(out, page.locator("#status").inner_text())
        browser.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
