"""engine/frontend/chat.py: chat messages rendered by the engine, trimmed to the context."""
import json

import pytest
from transformers import AutoTokenizer

from contract import ValidationError
from engine.frontend.chat import parse_messages, plain_format, render, render_chat

TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")


@pytest.fixture(scope="module")
def gpt2_tok(gpt2_model):
    return AutoTokenizer.from_pretrained(gpt2_model)


@pytest.fixture(scope="module")
def llama_tok(llama_model):
    tok = AutoTokenizer.from_pretrained(llama_model)
    tok.chat_template = TEMPLATE
    return tok


def test_plain_format_without_a_template(gpt2_tok):
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    prompt, dropped = render_chat(gpt2_tok, json.dumps(msgs), 100)
    assert prompt == "System: be brief\nUser: hi\nAssistant:" == plain_format(msgs) and dropped == 0


def test_template_is_used_and_bos_not_doubled(llama_tok):
    prompt, _ = render_chat(llama_tok, [{"role": "user", "content": "hi"}], 100)
    assert prompt == "<|user|>hi</s><|assistant|>"  # the tokenizer adds <s> itself
    ids = llama_tok(prompt)["input_ids"]
    assert ids[0] == llama_tok.bos_token_id and ids[1] != llama_tok.bos_token_id


def test_oldest_turns_are_dropped_first_system_kept(gpt2_tok):
    msgs = [{"role": "system", "content": "sys"}]
    for i in range(6):
        msgs += [{"role": "user", "content": f"question {i} " + "word " * 20},
                 {"role": "assistant", "content": f"answer {i} " + "word " * 20}]
    msgs.append({"role": "user", "content": "last question"})
    full = len(gpt2_tok(plain_format(msgs))["input_ids"])
    prompt, dropped = render_chat(gpt2_tok, msgs, full // 2)
    assert len(gpt2_tok(prompt)["input_ids"]) <= full // 2
    assert dropped > 0 and dropped % 2 == 0  # whole user+assistant turns
    assert prompt.startswith("System: sys\nUser: question ") and prompt.endswith("User: last question\nAssistant:")
    assert f"question {dropped // 2} " in prompt and f"question {dropped // 2 - 1} " not in prompt


def test_errors_name_messages(gpt2_tok):
    for bad in ("not json", "[]", '[{"role": "wizard", "content": "x"}]', '[{"role": "user"}]',
                '[{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]'):
        with pytest.raises(ValidationError) as err:
            render_chat(gpt2_tok, bad, 100)
        assert err.value.field == "messages"
    with pytest.raises(ValidationError, match="does not fit"):
        render_chat(gpt2_tok, [{"role": "user", "content": "word " * 200}], 50)


def test_openai_content_parts(gpt2_tok):
    msgs = parse_messages([{"role": "user", "content": [{"type": "text", "text": "a"},
                                                       {"type": "text", "text": "b"}]}])
    assert msgs == [{"role": "user", "content": "ab"}]


def test_template_refusal_is_a_validation_error(gpt2_model):
    tok = AutoTokenizer.from_pretrained(gpt2_model)
    tok.chat_template = ("{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
                         "{{ raise_exception('roles must alternate') }}{% endif %}{{ m['content'] }}"
                         "{% endfor %}")
    with pytest.raises(ValidationError, match="roles must alternate") as err:
        render_chat(tok, [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], 100)
    assert err.value.field == "messages"


def test_trimming_never_leaves_an_assistant_message_first(gpt2_tok):
    msgs = [{"role": "user", "content": "word " * 30}, {"role": "assistant", "content": "x " * 30},
            {"role": "assistant", "content": "y " * 30}, {"role": "user", "content": "last"}]
    prompt, dropped = render_chat(gpt2_tok, msgs, 40)
    assert prompt == "User: last\nAssistant:" and dropped == 3


def _quadratic_reference(tok, msgs, budget):
    """The old rule, one turn at a time: drop the oldest turn until the rendered prompt fits."""
    system = [m for m in msgs if m["role"] == "system"]
    turns = [m for m in msgs if m["role"] != "system"]
    dropped = 0
    while len(tok(render(tok, system + turns))["input_ids"]) > budget:
        cut = 2 if len(turns) > 2 and turns[1]["role"] == "assistant" else 1
        while cut < len(turns) - 1 and turns[cut]["role"] == "assistant":
            cut += 1
        turns, dropped = turns[cut:], dropped + cut
    return render(tok, system + turns), dropped


@pytest.mark.parametrize("which", ["plain", "template"])
def test_linear_trimming_keeps_what_one_turn_at_a_time_kept(gpt2_tok, llama_tok, which):
    import random
    tok = gpt2_tok if which == "plain" else llama_tok
    rng = random.Random(5)
    compared = 0
    for _ in range(40):
        msgs = [{"role": "system", "content": "be brief"}] if rng.random() < 0.5 else []
        for _ in range(rng.randint(1, 12)):
            msgs.append({"role": "user", "content": " ".join(["word"] * rng.randint(1, 30))})
            if rng.random() < 0.8:
                msgs.append({"role": "assistant", "content": "ok " * rng.randint(1, 30)})
        msgs.append({"role": "user", "content": "last"})
        full = len(tok(render(tok, msgs))["input_ids"])
        budget = rng.randint(full // 4 + 20, full + 5)
        try:
            expected = _quadratic_reference(tok, msgs, budget)
        except ValidationError:  # nothing the old rule could render: the new one refuses too
            with pytest.raises(ValidationError):
                render_chat(tok, msgs, budget)
            continue
        assert render_chat(tok, msgs, budget) == expected
        compared += 1
    # every budget leaves room for the last message, so (measured) all 40 cases are compared;
    # a generator or reference that made most of them raise would test nothing
    assert compared >= 35, f"only {compared} of 40 cases compared with the one-turn-at-a-time rule"


def test_thousands_of_messages_are_refused_or_trimmed_quickly(gpt2_tok):
    import time
    many = [{"role": "user", "content": "hi"}] * 4000
    started = time.perf_counter()
    with pytest.raises(ValidationError, match="at most 512 messages"):
        render_chat(gpt2_tok, many, 400)
    allowed = [{"role": "user" if i % 2 == 0 else "assistant", "content": "hi there"} for i in range(511)]
    prompt, dropped = render_chat(gpt2_tok, allowed, 100)
    assert dropped > 400 and len(gpt2_tok(prompt)["input_ids"]) <= 100
    assert time.perf_counter() - started < 5  # was minutes: trimming re-rendered everything per turn


def test_first_true_finds_the_boundary_from_any_guess():
    from engine.frontend.chat import _first_true
    for n in range(1, 12):
        for boundary in range(n + 1):  # pred is true from `boundary` on (n: never)
            for guess in range(n):
                calls = []
                got = _first_true(lambda k, calls=calls, boundary=boundary: calls.append(k) or k >= boundary,
                                  guess, n)
                assert got == (boundary if boundary < n else None), (n, boundary, guess)
                assert all(0 <= k < n for k in calls)
