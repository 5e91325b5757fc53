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

A model without a template is a base model, which knows no end of turn: after a good first
answer it writes the conversation on ("User: ... Assistant: ..."), to max_tokens. Its chat
answers therefore end at the plain format's next turn marker (`turn_markers`: a newline, or
two, then "User:", "System:" or "Assistant:"), a stop sequence the engine applies beside the
request's own: never streamed, and the answer ends as a template model's end-of-turn token
ends it (finish reason eos_token: OpenAI's and Ollama's "stop", Anthropic's "end_turn"), so
`ignore_eos` goes past it too. Stopping beats refusing such models on the chat routes: base
models answer the first turn well, and chat pages and Ollama's users point chat at any model.
"""
import bisect
import json
import re
from collections.abc import Callable
from typing import Any, Optional, cast

from jinja2 import TemplateError
from transformers import PreTrainedTokenizerBase

from contract import DEFAULT_LIMITS, RequestLimits, ValidationError, check

from ..policies.tools import ToolSpec, openai_tools, render_messages

ROLES = ("system", "user", "assistant", "tool")
Message = dict[str, Any]  # role, content; an assistant's tool_calls, a tool's tool_call_id
# the roles the plain format writes: a tool's result is a user turn there (render_messages)
PLAIN_ROLES = ("system", "user", "assistant")


def parse_messages(raw: str | list[Any], limits: RequestLimits = DEFAULT_LIMITS) -> list[Message]:
    """Validate messages (a JSON string or a list); errors name the field `messages`.
    Sizes are checked before anything else is done with them."""
    if isinstance(raw, str):
        check(len(raw) <= limits.max_body_bytes, "messages",
              f"{len(raw)} characters of JSON; at most {limits.max_body_bytes}")
        try:
            raw = json.loads(raw)
        except (json.JSONDecodeError, RecursionError) as exc:
            raise ValidationError("messages", f"not valid JSON: {exc}") from None
    limits.check_messages(raw)
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
        if content is None and m["role"] == "assistant" and m.get("tool_calls"):
            content = ""  # OpenAI's assistant turn that only calls tools
        if not isinstance(content, str):
            raise ValidationError("messages", f"message {i}: content must be a string")
        message: Message = {"role": m["role"], "content": content}
        if m["role"] == "assistant" and m.get("tool_calls"):
            message["tool_calls"] = [_call(c, i) for c in m["tool_calls"]]
        if m["role"] == "tool":
            message["tool_call_id"] = str(m.get("tool_call_id") or "")
        messages.append(message)
    if messages[-1]["role"] == "assistant":
        raise ValidationError("messages", "the last message must not be the assistant's")
    return messages


def _call(call: Any, i: int) -> dict[str, Any]:
    """An assistant's earlier call, as templates and the generic format read it: its name and
    its arguments as an object (OpenAI sends them as JSON text)."""
    function = call.get("function") if isinstance(call, dict) else None
    check(isinstance(function, dict) and isinstance(function.get("name"), str), "messages",
          f"message {i}: each tool_calls entry must be {{\"function\": {{\"name\", \"arguments\"}}}}")
    arguments = function.get("arguments") or {}  # type: ignore[union-attr]
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            raise ValidationError("messages", f"message {i}: tool call arguments are not valid JSON") from None
    return {"name": function["name"], "arguments": arguments}  # type: ignore[index]


def _label(role: str) -> str:
    """A turn's start in the plain format, without its content: "User:"."""
    return f"{role.capitalize()}:"


def plain_format(messages: list[Message]) -> str:
    lines = [f"{_label(m['role'])} {m['content']}" for m in messages]
    return "\n".join(lines + [_label("assistant")])


# the next turn's start, after one newline or two: "\n\nUser:" too, so that the answer keeps no
# trailing newline of its own when the model leaves a blank line between turns
TURN_MARKERS = tuple(f"{newlines}{_label(role)}" for newlines in ("\n\n", "\n") for role in PLAIN_ROLES)


def turn_markers(tokenizer: PreTrainedTokenizerBase) -> tuple[str, ...]:
    """The stop sequences that end a chat answer besides the request's own: the plain format's
    turn markers where the model has no template (see the module docstring); none where it has
    one, whose end-of-turn token ends the answer."""
    return () if getattr(tokenizer, "chat_template", None) else TURN_MARKERS


def _template(tokenizer: PreTrainedTokenizerBase, messages: list[Message],
              tools: Optional[list[dict[str, Any]]] = None) -> str:
    text = cast(str, tokenizer.apply_chat_template(messages, tools=tools,  # type: ignore[arg-type]
                                                   tokenize=False, add_generation_prompt=True))
    # The engine tokenizes with special tokens; a template that writes BOS itself would double it.
    bos = tokenizer.bos_token
    if bos and text.startswith(bos) and _adds_bos(tokenizer):
        text = text[len(bos):]
    return text


def _adds_bos(tokenizer: PreTrainedTokenizerBase) -> bool:
    ids = tokenizer("a")["input_ids"]
    return bool(ids) and ids[0] == tokenizer.bos_token_id


def knows_tools(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether the chat template renders tools itself (it reads a `tools` variable)."""
    template = getattr(tokenizer, "chat_template", None)
    return isinstance(template, str) and re.search(r"\btools\b", template) is not None


def render(tokenizer: PreTrainedTokenizerBase, messages: list[Message], spec: Optional[ToolSpec] = None) -> str:
    """The prompt: the model's template (its own tools format when it has one), else the
    plain format; tools and calls in the generic format where the template knows none."""
    own_tools = knows_tools(tokenizer)
    if not own_tools:
        messages = render_messages(messages, spec)
    if not getattr(tokenizer, "chat_template", None):
        return plain_format(messages)
    try:
        return _template(tokenizer, messages, openai_tools(spec) if own_tools and spec else None)
    except (TemplateError, ValueError, TypeError) as exc:  # e.g. "roles must alternate"
        raise ValidationError("messages", f"the model's chat template rejects them: {exc}") from None


def render_chat(tokenizer: PreTrainedTokenizerBase, messages: str | list[Any], max_prompt_tokens: int,
                limits: RequestLimits = DEFAULT_LIMITS) -> tuple[str, int]:
    """Return (prompt, dropped): the rendered prompt and how many oldest messages were dropped
    so that it fits `max_prompt_tokens` (the context minus the tokens to generate)."""
    prompt, _, dropped = render_chat_ids(tokenizer, messages, max_prompt_tokens, limits)
    return prompt, dropped


def render_chat_ids(tokenizer: PreTrainedTokenizerBase, messages: str | list[Any], max_prompt_tokens: int,
                    limits: RequestLimits = DEFAULT_LIMITS,
                    spec: Optional[ToolSpec] = None) -> tuple[str, list[int], int]:
    """(prompt, its token ids, dropped messages): the oldest turns are dropped until it fits.

    Near-linear in the conversation's size: each message is tokenized once to estimate where
    the kept part starts (suffix sums), then a gallop from that guess finds the exact start
    with a few whole renders (usually two), O(log n) of them at worst."""
    msgs = parse_messages(messages, limits)
    system = [m for m in msgs if m["role"] == "system"]
    turns = [m for m in msgs if m["role"] != "system"]
    # where the kept part may start: a user message (never an assistant one), or the last
    starts = [i for i, m in enumerate(turns) if m["role"] == "user" or i == len(turns) - 1]
    rendered: dict[int, tuple[str, list[int]]] = {}

    def fits(k: int) -> bool:
        if k not in rendered:
            prompt = render(tokenizer, system + turns[starts[k]:], spec)
            rendered[k] = prompt, tokenizer(prompt)["input_ids"]
        return len(rendered[k][1]) <= max_prompt_tokens

    guess = bisect.bisect_left(starts, _first_turn_that_fits(tokenizer, system, turns, max_prompt_tokens))
    k = _first_true(fits, min(guess, len(starts) - 1), len(starts))
    if k is None:
        raise ValidationError("messages", (
            f"the last message alone does not fit the model's context: at most "
            f"{max_prompt_tokens} prompt tokens with this max_tokens"))
    return *rendered[k], starts[k]


def _first_true(pred: Callable[[int], bool], guess: int, n: int) -> Optional[int]:
    """The smallest k in [0, n) with pred(k), for a pred that is false then true; probes
    galloping out from `guess`, then bisects."""
    step = 1
    if pred(guess):
        hi, lo = guess, guess - 1
        while lo >= 0 and pred(lo):
            hi, lo, step = lo, lo - step, step * 2
        lo = max(lo, -1)  # pred(lo) is false (or lo is before the start)
    else:
        lo = hi = guess
        while not pred(hi):
            if hi == n - 1:
                return None
            lo, hi, step = hi, min(hi + step, n - 1), step * 2
    while hi - lo > 1:  # pred(lo) false, pred(hi) true
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if pred(mid) else (mid, hi)
    return hi


def _first_turn_that_fits(tokenizer: PreTrainedTokenizerBase, system: list[Message],
                          turns: list[Message], budget: int) -> int:
    """Estimate: the last turn with the system messages, rendered, plus each earlier message's
    own tokens and the template's per-message overhead, summed from the newest back."""
    if len(turns) <= 1:
        return 0
    fixed = _length(tokenizer, system + turns[-1:])
    overhead = _per_message_overhead(tokenizer, system, turns[-1])
    contents = tokenizer([m["content"] for m in turns[:-1]], add_special_tokens=False)["input_ids"]
    used, start = fixed, len(turns) - 1
    for i in range(len(turns) - 2, -1, -1):
        used += len(contents[i]) + overhead
        if used > budget:
            break
        start = i
    return start


def _length(tokenizer: PreTrainedTokenizerBase, messages: list[Message]) -> int:
    return len(tokenizer(render(tokenizer, messages))["input_ids"])


def _per_message_overhead(tokenizer: PreTrainedTokenizerBase, system: list[Message], last: Message) -> int:
    """Tokens a template adds around one message's content (role markers, separators)."""
    pair = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "a"}]
    try:
        with_pair = _length(tokenizer, system + pair + [last])
    except ValidationError:  # a template with rules of its own: count contents only
        return 0
    a = len(tokenizer("a", add_special_tokens=False)["input_ids"])
    return max(0, (with_pair - _length(tokenizer, system + [last])) // 2 - a)
