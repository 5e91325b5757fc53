"""executors/engine/chat.py: chat messages rendered by the engine, trimmed to the context."""
import json

import pytest
from transformers import AutoTokenizer

from executors.engine.chat import parse_messages, plain_format, render_chat
from executors.engine.params import ValidationError

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
