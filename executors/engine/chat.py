"""Chat messages -> one prompt string, rendered where the tokenizer lives (the engine side).

Every transport (OpenAI chat, the WebSocket chat) sends messages and gets the same
rendering. With a chat template the tokenizer's own template is used; without one,
the plain format below. Conversations longer than the context are trimmed by
dropping the oldest turns first (system messages are kept, the last message always).

Plain format (tokenizers without a chat template)::

    System: <content>
    User: <content>
    Assistant: <content>
    User: <content>
    Assistant:

one line per message ("Role: content"), the role capitalised, then "Assistant:" so the
model continues as the assistant.
"""
import json
from typing import Any

from jinja2 import TemplateError
from transformers import PreTrainedTokenizerBase

from .params import ValidationError

ROLES = ("system", "user", "assistant")
Message = dict[str, str]


def parse_messages(raw: str | list[Any]) -> list[Message]:
    """Validate messages (a JSON string or a list); errors name the field `messages`."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValidationError("messages", f"not valid JSON: {exc}") from None
    if not isinstance(raw, list) or not raw:
        raise ValidationError("messages", "must be a non-empty list of {role, content} objects")
    messages: list[Message] = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise ValidationError("messages", f"message {i}: role must be one of {', '.join(ROLES)}")
        content = m.get("content")
        if isinstance(content, list):  # OpenAI content parts: keep the text parts
            content = "".join(p.get("text", "") for p in content
                              if isinstance(p, dict) and p.get("type") == "text")
        if not isinstance(content, str):
            raise ValidationError("messages", f"message {i}: content must be a string")
        messages.append({"role": m["role"], "content": content})
    if messages[-1]["role"] == "assistant":
        raise ValidationError("messages", "the last message must not be the assistant's")
    return messages


def plain_format(messages: list[Message]) -> str:
    lines = [f"{m['role'].capitalize()}: {m['content']}" for m in messages]
    return "\n".join(lines + ["Assistant:"])


def _template(tokenizer: PreTrainedTokenizerBase, messages: list[Message]) -> str:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    # The engine tokenizes with special tokens; a template that writes BOS itself would double it.
    bos = tokenizer.bos_token
    if bos and text.startswith(bos) and _adds_bos(tokenizer):
        text = text[len(bos):]
    return text


def _adds_bos(tokenizer: PreTrainedTokenizerBase) -> bool:
    ids = tokenizer("a")["input_ids"]
    return bool(ids) and ids[0] == tokenizer.bos_token_id


def render(tokenizer: PreTrainedTokenizerBase, messages: list[Message]) -> str:
    if not getattr(tokenizer, "chat_template", None):
        return plain_format(messages)
    try:
        return _template(tokenizer, messages)
    except (TemplateError, ValueError, TypeError) as exc:  # e.g. "roles must alternate"
        raise ValidationError("messages", f"the model's chat template rejects them: {exc}") from None


def render_chat(tokenizer: PreTrainedTokenizerBase, messages: str | list[Any],
                max_prompt_tokens: int) -> tuple[str, int]:
    """Return (prompt, dropped): the rendered prompt and how many oldest messages were dropped
    so that it fits `max_prompt_tokens` (the context minus the tokens to generate)."""
    msgs = parse_messages(messages)
    system = [m for m in msgs if m["role"] == "system"]
    turns = [m for m in msgs if m["role"] != "system"]
    dropped = 0
    while True:
        prompt = render(tokenizer, system + turns)
        if len(tokenizer(prompt)["input_ids"]) <= max_prompt_tokens:
            return prompt, dropped
        if len(turns) <= 1:
            raise ValidationError("messages", (
                f"the last message alone does not fit the model's context: at most "
                f"{max_prompt_tokens} prompt tokens with this max_tokens"))
        # drop the oldest turn: a user message and the assistant answer after it
        cut = 2 if len(turns) > 2 and turns[1]["role"] == "assistant" else 1
        while cut < len(turns) - 1 and turns[cut]["role"] == "assistant":  # never start with one
            cut += 1
        turns, dropped = turns[cut:], dropped + cut
