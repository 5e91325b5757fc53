"""The browser chat page (/chat-ui) in headless Chromium, on the real model, driven as a user
drives it: an answer streams and stops, and survives its socket dropping; settings are checked
against the server's bounds as they are typed; New chat and another conversation stop an answer
that streams; a reload reopens the conversation its URL names (IndexedDB); an edit and a
regeneration make branches, a code block is copied, the system prompt reaches the model, and the
layout fits from a phone to a wide screen with no label cut. Model output cannot become markup.
Every state is kept as a screenshot under $LLM_TEST_ARTIFACTS (test-artifacts/ by default)."""
import pytest
import requests

from tests.gateway_helpers import chat_page, needs_chromium, set_fields

from .chat_page_steps import (
    CUT_LABELS,
    HOSTILE,
    IDLE,
    LONG_STORY,
    RECORD_SENT,
    reference,
    send,
    settings_of,
    shot,
    shown,
    start_long_answer,
)


@pytest.fixture(scope="module")
def page(real_flow):
    with chat_page(f"http://127.0.0.1:{real_flow[1]}/chat-ui") as opened:
        yield opened


@needs_chromium
def test_markdown_is_rendered_and_model_html_is_inert(page):
    # rendered into a box of its own in the page: the page may redraw its log (#log) at any moment
    html, markup, links = page.evaluate("""(t) => { const d = renderMarkdown(t);
        const box = document.body.appendChild(document.createElement('div')); box.appendChild(d);
        const seen = [d.innerHTML, ['img', 'script', 'b', 'i'].map((x) => d.querySelectorAll(x).length),
                      [...d.querySelectorAll('a')].map((a) => a.href).join()];
        return seen; }""", HOSTILE)
    assert page.evaluate("window.pwned") is None
    assert markup == [0, 0, 0, 0], html  # the model's tags, and its image, never became elements
    assert "&lt;img src=x" in html and "&lt;script&gt;" in html  # shown as text
    assert "<strong>bold</strong>" in html and "<em>em</em>" in html
    assert "<code>&lt;b&gt;code&lt;/b&gt;</code>" in html
    assert "javascript:" not in links
    assert 'href="https://example.com" target="_blank" rel="noopener noreferrer"' in html
    assert "<table>" in html and "<blockquote>" in html and "2 * 3 * 4" in html
    assert 'class="language-python hljs"' in html and "copy-code" in html  # highlighted, with its copy button
    page.evaluate("() => document.body.lastElementChild.remove()")


@needs_chromium
def test_an_answer_streams_and_stops(page, real_flow):
    from playwright.sync_api import expect
    question = "List three fruits."
    set_fields(page, temperature=0, max_tokens=40)
    send(page, question)
    answer = page.locator(".message.assistant").last
    ref = reference(real_flow[1], [{"role": "user", "content": question}], 40)
    assert answer.get_attribute("data-text") == ref["message"]["content"]  # temperature 0 was sent
    assert answer.get_attribute("data-finish") == {"length": "length", "stop": "eos_token"}[ref["finish_reason"]]
    assert answer.locator("ol li, ul li").count() >= 1  # the model's list, as a list
    expect(answer.locator(".meta")).to_contain_text("tokens/s")
    expect(page.locator("#model")).to_contain_text("SmolLM2-135M-Instruct")
    shot(page, "answered")
    set_fields(page, max_tokens=600)
    page.fill("#prompt", LONG_STORY)
    page.press("#prompt", "Enter")
    expect(page.locator("body")).to_have_attribute("data-state", "generating")
    page.wait_for_function("() => (document.querySelector('.message.assistant:last-child')?.dataset.text || '')"
                           ".length > 20", timeout=IDLE)
    shot(page, "streaming")
    page.click("#stop")
    expect(page.locator("body")).to_have_attribute("data-state", "idle", timeout=30000)
    assert page.locator(".message.assistant").last.get_attribute("data-finish") == "cancelled"
    set_fields(page, max_tokens=40)


@needs_chromium
def test_an_answer_whose_socket_drops_goes_on(page, real_flow):
    """The socket closes mid-answer: the page reconnects, resumes from the last event it got, and
    the answer comes out whole, as the same greedy request over HTTP gives it."""
    from playwright.sync_api import expect
    question = "Describe a forest in autumn."
    page.click("#new-chat")
    set_fields(page, temperature=0, max_tokens=64)
    page.fill("#prompt", question)
    page.press("#prompt", "Enter")
    page.wait_for_function("() => (document.querySelector('.message.assistant:last-child')?.dataset.text || '')"
                           ".length > 10", timeout=IDLE)
    page.evaluate("socket.close()")  # the page's own socket, as a network change would drop it
    expect(page.locator("#status")).to_contain_text("reconnecting")
    expect(page.locator("body")).to_have_attribute("data-state", "idle", timeout=IDLE)
    ref = reference(real_flow[1], [{"role": "user", "content": question}], 64)
    answer = page.locator(".message.assistant").last
    assert answer.get_attribute("data-text") == ref["message"]["content"]
    assert answer.get_attribute("data-finish") == {"length": "length", "stop": "eos_token"}[ref["finish_reason"]]


@needs_chromium
def test_settings_are_checked_against_the_servers_bounds(page, real_flow):
    """Out of range as typed: marked, with the server's bound, not saved, and no question goes
    while it stays so; a bad setting saved before is shown marked and is not sent either."""
    from playwright.sync_api import expect
    http_port = real_flow[1]
    served = settings_of(http_port)
    limit = served["bounds"][served["models"][0]]["max_tokens"]["le"]
    refused = requests.post(f"http://127.0.0.1:{http_port}/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": limit + 1})
    assert refused.status_code == 400 and "max_tokens" in refused.text  # the server's own bound
    page.click("#new-chat")
    set_fields(page, max_tokens=40)
    page.click("#settings-toggle")
    cases = {"max_tokens": (str(limit + 1), f"at most {limit}"), "top_p": ("0", "more than 0"),
             "seed": (str(2**64), f"at most {2**64 - 1}"), "temperature": ("warm", "must be a number"),
             "top_k": ("1.5", "a whole number"), "stop": ("\n".join("x" * 17), "at most 16 lines")}
    for name, (text, why) in cases.items():
        page.fill(f"#setting-{name}", text)
        expect(page.locator(f"#setting-{name}")).to_have_attribute("aria-invalid", "true")
        expect(page.locator(f"#problem-{name}")).to_contain_text(why)
        if name == "max_tokens":
            shot(page, "settings-invalid")
        saved = page.evaluate("JSON.parse(localStorage.getItem('llm-stream-chat-settings'))")
        assert saved.get(name, "") != text  # not saved: the last valid text stays
        page.fill(f"#setting-{name}", "")
    page.fill("#setting-seed", str(2**64 - 1))  # the top of the range, exactly
    expect(page.locator("#setting-seed")).to_have_attribute("aria-invalid", "false")
    page.fill("#setting-max_tokens", str(limit + 1))
    page.click("#settings-toggle")
    page.evaluate(RECORD_SENT)
    page.fill("#prompt", "Name a colour.")
    page.press("#prompt", "Enter")
    expect(page.locator("#status")).to_contain_text(f"not sent: max_tokens: must be at most {limit}")
    expect(page.locator("#settings")).to_be_visible()  # opened at the field to fix
    assert page.evaluate("sent") == [] and page.locator(".message").count() == 0
    assert page.input_value("#prompt") == "Name a colour."  # kept, for when it is fixed
    page.fill("#setting-max_tokens", "4")
    page.click("#settings-toggle")
    set_fields(page, temperature=1)
    send(page, "Name a colour.")
    question = [m for m in page.evaluate("sent") if '"prompt"' in m][-1]
    assert f'"seed":{2**64 - 1}' in question and '"max_tokens":4' in question  # integers sent exactly
    assert page.locator(".message.assistant").last.get_attribute("data-finish") in ("length", "eos_token")
    set_fields(page, temperature=0, seed="")
    # saved when the page did not check, or before the server's bounds changed
    page.evaluate(f"""() => localStorage.setItem('llm-stream-chat-settings', JSON.stringify(
        {{...JSON.parse(localStorage.getItem('llm-stream-chat-settings')), max_tokens: '{limit * 5}'}}))""")
    page.reload()
    expect(page.locator("#status")).to_have_text("connected", timeout=15000)
    expect(page.locator("#setting-max_tokens")).to_have_attribute("aria-invalid", "true")
    assert page.input_value("#setting-max_tokens") == str(limit * 5)  # shown, marked...
    assert "max_tokens" not in page.evaluate("JSON.parse(localStorage.getItem('llm-stream-chat-settings'))")
    page.evaluate(RECORD_SENT)
    count = page.locator(".message").count()
    page.fill("#prompt", "Name a colour.")
    page.press("#prompt", "Enter")
    expect(page.locator("#status")).to_contain_text("not sent: max_tokens")  # ...and never sent
    assert page.evaluate("sent") == [] and page.locator(".message").count() == count
    page.fill("#setting-max_tokens", "40")
    page.click("#settings-toggle")
    page.fill("#prompt", "")


@needs_chromium
def test_new_chat_and_another_conversation_stop_the_answer(page):
    """While an answer streams, New chat, or a click on another conversation, stops it as Stop
    does (it is kept, cancelled), then shows what was asked for."""
    from playwright.sync_api import expect
    page.click("#new-chat")
    story = start_long_answer(page, "Write a long story about a lighthouse keeper and a storm.")
    page.evaluate(RECORD_SENT)
    page.click("#new-chat")
    expect(page.locator("body")).to_have_attribute("data-state", "idle", timeout=30000)
    assert '{"type":"stop"}' in page.evaluate("sent")
    expect(page.locator("#empty")).to_be_visible()  # the new chat, empty
    assert page.locator(".message").count() == 0 and "#/c/" not in page.url
    page.locator(f".conversation[data-id='{story}'] .open").click()
    assert page.url.endswith(f"#/c/{story}")
    expect(page.locator(".message.assistant").last).to_have_attribute("data-finish", "cancelled")
    other_id = page.locator(f".conversation:not([data-id='{story}'])").first.get_attribute("data-id")
    start_long_answer(page, "Write another long story, about a sailor and a whale, with many chapters.")
    page.locator(f".conversation[data-id='{other_id}'] .open").click()
    expect(page.locator("body")).to_have_attribute("data-state", "idle", timeout=30000)
    assert page.url.endswith(f"#/c/{other_id}")
    expect(page.locator(f".conversation[data-id='{other_id}']")).to_have_attribute("aria-current", "true")
    page.locator(f".conversation[data-id='{story}'] .open").click()
    expect(page.locator(".message.assistant")).to_have_count(2)
    expect(page.locator(".message.assistant").last).to_have_attribute("data-finish", "cancelled")
    set_fields(page, max_tokens=40)


@needs_chromium
def test_a_reload_finds_the_conversation(page, real_flow):
    """The URL names the conversation shown (#/c/<id>): a reload shows it again; a page without
    one, or with one this browser does not keep, opens an empty new chat."""
    from playwright.sync_api import expect
    page.locator(".conversation .open", has_text="List three fruits.").click()
    conv = page.locator(".conversation[aria-current='true']").get_attribute("data-id")
    assert page.url.endswith(f"#/c/{conv}")
    before = shown(page)
    page.reload()
    expect(page.locator("#status")).to_have_text("connected", timeout=15000)
    expect(page.locator(".message")).to_have_count(len(before))  # without a click
    assert shown(page) == before
    expect(page.locator(f".conversation[data-id='{conv}']")).to_have_attribute("aria-current", "true")
    shot(page, "reopened")
    page.go_back()  # the conversation opened before it, as the back button goes
    expect(page.locator(f".conversation[data-id='{conv}']")).to_have_attribute("aria-current", "false")
    page.go_forward()
    expect(page.locator(f".conversation[data-id='{conv}']")).to_have_attribute("aria-current", "true")
    base = f"http://127.0.0.1:{real_flow[1]}/chat-ui"
    page.goto(base)  # no conversation named
    expect(page.locator("#status")).to_have_text("connected", timeout=15000)
    empty, note = page.locator("#empty"), 'No conversation "no-such-conversation" is kept in this browser.'
    expect(empty).to_contain_text("Ask SmolLM2-135M-Instruct something.", timeout=15000)
    assert page.locator(".message").count() == 0
    shot(page, "empty")
    page.goto(f"{base}#/c/no-such-conversation")  # a link to one this browser lacks, within the page...
    expect(empty).to_contain_text(note)
    assert page.url == base and page.locator(".message").count() == 0  # the address names no conversation
    page.goto("about:blank")
    page.goto(f"{base}#/c/no-such-conversation")  # ...and loaded anew
    expect(page.locator("#status")).to_have_text("connected", timeout=15000)
    expect(empty).to_contain_text(note)
    assert page.locator(".message").count() == 0
    shot(page, "not-kept")
    page.locator(f".conversation[data-id='{conv}'] .open").click()
    assert shown(page) == before
    page.fill("#search", "dragon")
    expect(page.locator(".conversation")).to_have_count(1)
    page.fill("#search", "no such words anywhere")
    expect(page.locator(".conversation")).to_have_count(0)
    page.fill("#search", "")
    shot(page, "reloaded")


@needs_chromium
def test_conversations_are_renamed_deleted_exported_and_imported(page, tmp_path):
    from playwright.sync_api import expect
    fruits = page.locator(".conversation", has_text="List three fruits.")
    page.once("dialog", lambda dialog: dialog.accept("Fruit talk"))
    fruits.locator(".rename").click()
    renamed = page.locator(".conversation", has_text="Fruit talk")
    expect(renamed).to_have_count(1)
    with page.expect_download() as download:
        page.click("#export")
    exported = tmp_path / "conversations.json"
    download.value.save_as(exported)
    count = page.locator(".conversation").count()
    page.once("dialog", lambda dialog: dialog.accept())
    renamed.locator(".delete").click()
    expect(page.locator(".conversation")).to_have_count(count - 1)
    page.set_input_files("#import-file", str(exported))
    expect(page.locator(".conversation")).to_have_count(count)
    page.locator(".conversation .open", has_text="Fruit talk").click()
    expect(page.locator(".message.user .content").first).to_have_text("List three fruits.")


@needs_chromium
def test_edit_and_regenerate_make_branches(page, real_flow):
    from playwright.sync_api import expect
    page.click("#new-chat")
    set_fields(page, temperature=0, max_tokens=24)
    send(page, "Name a colour.")
    first = page.locator(".message.assistant").last.get_attribute("data-text")
    set_fields(page, temperature=1.0, seed=7)
    page.locator(".message.assistant .regenerate").last.click()
    expect(page.locator("body")).to_have_attribute("data-state", "idle", timeout=IDLE)
    expect(page.locator(".message.assistant .branch").last).to_have_text("2/2")
    second = page.locator(".message.assistant").last.get_attribute("data-text")
    page.locator(".message.assistant .branch-prev").last.click()
    assert page.locator(".message.assistant").last.get_attribute("data-text") == first
    set_fields(page, temperature=0, seed="")
    page.locator(".message.user .edit").last.click()
    page.fill(".edit-box", "Name a fruit.")
    page.click(".save-edit")
    expect(page.locator("body")).to_have_attribute("data-state", "idle", timeout=IDLE)
    expect(page.locator(".message.user .branch").last).to_have_text("2/2")
    edited = reference(real_flow[1], [{"role": "user", "content": "Name a fruit."}], 24)["message"]["content"]
    assert page.locator(".message.assistant").last.get_attribute("data-text") == edited
    shot(page, "branched")
    page.locator(".message.user .branch-prev").last.click()  # back to the first question, its last answer
    expect(page.locator(".message.user .content").last).to_have_text("Name a colour.")
    assert page.locator(".message.assistant").last.get_attribute("data-text") == second != first


@needs_chromium
def test_a_code_block_is_copied(page):
    page.evaluate("() => document.getElementById('log').appendChild(renderMarkdown('```python\\nprint(1)\\n```'))")
    page.locator("#log .copy-code").last.click()
    assert page.evaluate("navigator.clipboard.readText()").strip() == "print(1)"
    assert page.locator("#log .copy-code").last.get_attribute("data-copied") == "true"


@needs_chromium
def test_the_system_prompt_reaches_the_model(page, real_flow):
    question = "Who are you?"
    system = "You are a pirate named Jack. Always talk like a pirate."
    page.click("#new-chat")
    set_fields(page, system=system, temperature=0, max_tokens=24)
    send(page, question)
    ref = reference(real_flow[1], [{"role": "system", "content": system}, {"role": "user", "content": question}], 24)
    plain = reference(real_flow[1], [{"role": "user", "content": question}], 24)
    assert ref["message"]["content"] != plain["message"]["content"]  # the test can tell
    assert page.locator(".message.assistant").last.get_attribute("data-text") == ref["message"]["content"]
    set_fields(page, system="")
    shot(page, "system-prompt")


@needs_chromium
def test_the_page_loads_without_a_failed_request(page):
    """Its icon is inline: no request for /favicon.ico, nor any other that fails."""
    failed: list[str] = []

    def answered(response) -> None:
        if response.status >= 400:
            failed.append(f"{response.status} {response.url}")

    def unanswered(request) -> None:
        failed.append(f"failed {request.url}")
    page.on("response", answered)
    page.on("requestfailed", unanswered)
    try:
        page.reload()
        page.wait_for_selector("#setting-max_tokens", state="attached")
    finally:
        page.remove_listener("response", answered)
        page.remove_listener("requestfailed", unanswered)
    assert page.locator("link[rel=icon]").get_attribute("href").startswith("data:image/svg+xml,")
    assert failed == []


@needs_chromium
@pytest.mark.parametrize("width,height", [(360, 740), (390, 844), (1280, 800), (1920, 1080)])
def test_the_layout_fits_narrow_and_wide(page, width, height):
    from playwright.sync_api import expect
    page.set_viewport_size({"width": width, "height": height})
    page.reload()
    expect(page.locator("#status")).to_have_text("connected", timeout=15000)
    if not page.locator(".conversation").count():  # run alone: a conversation to show
        set_fields(page, max_tokens=8)
        send(page, "Name a colour.")
    page.locator(".conversation .open", has_text="Name a colour.").first.dispatch_event("click")  # hidden on a phone
    expect(page.locator(".message")).not_to_have_count(0)
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    boxes = [page.locator(s).bounding_box() for s in ("#prompt", "#send", "#stop")]
    assert max(b["y"] for b in boxes) - min(b["y"] for b in boxes) < boxes[0]["height"]  # the form: one line
    page.wait_for_selector("#setting-max_tokens", state="attached")  # the model's name, in the header
    page.click("#settings-toggle")
    assert page.evaluate(CUT_LABELS) == []
    shot(page, f"settings-{width}")
    page.click("#settings-toggle")
    shot(page, f"chat-{width}")
    sidebar = page.locator("#sidebar")
    if width <= 720:
        assert not sidebar.is_visible()
        page.click("#menu")
    assert sidebar.is_visible()
    shot(page, f"layout-{width}")
    page.click("#theme")  # the other theme, kept for the next load
    theme = page.evaluate("document.documentElement.dataset.theme")
    page.reload()
    assert page.evaluate("document.documentElement.dataset.theme") == theme
    shot(page, f"layout-{width}-{theme}")
