"""The browser chat page (/chat-ui) in headless Chromium, on the trained model: markdown is
rendered without letting model output inject HTML, temperature and max tokens reach the
request, and the status line shows tokens per second."""
import pytest
import requests

from tests.gateway_helpers import chat_page, needs_chromium

HOSTILE = ('<img src=x onerror="window.pwned=1"> **bold** and *em* and `<b>code</b>`\n'
           '<script>window.pwned=2</script>\n\n- one\n- [two](javascript:window.pwned=3)\n'
           '1. [three](https://example.com)\n\n```\n<i>raw</i>\n```\n2 * 3 * 4')


@pytest.fixture(scope="module")
def page(real_flow):
    with chat_page(f"http://127.0.0.1:{real_flow[1]}/chat-ui") as opened:
        yield opened


@needs_chromium
def test_markdown_is_rendered_and_model_html_is_inert(page):
    html = page.evaluate("(t) => { const d = renderMarkdown(t); document.body.appendChild(d); "
                         "return d.innerHTML; }", HOSTILE)
    assert page.evaluate("window.pwned") is None
    assert "<img" not in html and "<script" not in html and "<b>" not in html and "<i>" not in html
    assert "&lt;img src=x" in html and "&lt;script&gt;" in html  # shown as text
    assert "<strong>bold</strong>" in html and "<em>em</em>" in html
    assert "<code>&lt;b&gt;code&lt;/b&gt;</code>" in html
    assert "<li>one</li>" in html and "<li>[two](javascript:window.pwned=3)</li>" in html
    assert '<a href="https://example.com"' in html and "<ol>" in html
    assert "<pre><code>&lt;i&gt;raw&lt;/i&gt;</code></pre>" in html
    assert "2 * 3 * 4" in html  # stars with spaces are not emphasis


@needs_chromium
def test_a_greedy_answer_streams_renders_and_shows_its_speed(page, real_flow):
    from playwright.sync_api import expect
    _, http_port = real_flow
    question = "List three fruits."
    page.fill("#temperature", "0")
    page.fill("#max-tokens", "40")
    page.fill("#prompt", question)
    page.click("#send")
    expect(page.locator("body")).to_have_attribute("data-state", "idle", timeout=60000)
    answer = page.locator(".assistant").last
    ref = requests.post(f"http://127.0.0.1:{http_port}/v1/chat/completions", timeout=120, json={
        "messages": [{"role": "user", "content": question}], "max_tokens": 40,
        "temperature": 0}).json()["choices"][0]
    assert answer.get_attribute("data-text") == ref["message"]["content"]  # temperature 0 was sent
    assert answer.get_attribute("data-finish") == {"length": "length", "stop": "eos_token"}[ref["finish_reason"]]
    assert answer.locator("ol li, ul li").count() >= 1  # the model's list, as a list
    expect(page.locator("#status")).to_contain_text("tokens/s")
    expect(page.locator("#model")).to_contain_text("SmolLM2-135M-Instruct")
