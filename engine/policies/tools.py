"""Tool calls for any model: the request's tools, their rendering, the grammar that makes every
call well-formed, and the parser that turns the answer's text into calls as it streams.

The format is Hermes' (Qwen's, and many fine-tunes'): each call is
    <tool_call>
    {"name": "<function>", "arguments": {<arguments>}}
    </tool_call>
and calls follow each other on new lines. A model whose chat template takes `tools=` gets them
through it; any other (SmolLM2's, for one) gets the generic rendering below. The grammar
(llguidance Lark, with each tool's parameters inlined as a JSON schema) makes `required` and a
named choice always call, and lets `auto` answer either plain text or calls: a text that starts
like a call is held back until it is one or is not.
"""
import functools
import json
import re
import uuid
from collections.abc import Callable, Generator
from dataclasses import dataclass, field, replace
from typing import Any, Optional

from contract import ValidationError, check

TAG, END_TAG = "<tool_call>", "</tool_call>"
NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
CHOICES = ("none", "auto", "required")
PREAMBLE = ("You can call functions to help answer. The functions, as JSON schemas:\n<tools>\n{tools}\n</tools>\n"
            "To call functions, answer with one block per call and nothing else:\n"
            "<tool_call>\n{{\"name\": <function name>, \"arguments\": <the arguments as a JSON object>}}\n"
            "</tool_call>")


@dataclass(frozen=True)
class ToolSpec:
    """A request's tools, validated: what rendering and the grammar need."""

    functions: list[dict[str, Any]]  # OpenAI's {"name", "description", "parameters"}
    choice: str  # auto | required | a function's name ("none" never gets this far)
    parallel: bool

    @classmethod
    @functools.lru_cache(maxsize=256)
    def parse(cls, tools: Optional[str], tool_choice: Optional[str], parallel_tool_calls: bool) -> Optional["ToolSpec"]:
        """None when the request asks for no tool calls; raises naming the field. Parsed once
        per process for the same text: validation, rendering, the grammar and the parser ask."""
        choice = tool_choice
        if not tools:
            check(choice in (None, "none", "auto"), "tool_choice", f"{choice!r} needs `tools`")
            return None
        functions = [_function(t, i) for i, t in enumerate(_json_list(tools))]
        names = [f["name"] for f in functions]
        check(len(set(names)) == len(names), "tools", "function names must be unique")
        choice = choice or "auto"
        check(choice in CHOICES or choice in names, "tool_choice",
              f"must be none, auto, required or a declared function's name ({', '.join(names)}), got {choice!r}")
        return None if choice == "none" else cls(functions, choice, parallel_tool_calls)

    def grammar(self) -> str:
        """The llguidance Lark grammar of an answer: calls, or (auto) text that is not a call."""
        called = self.functions if self.choice in CHOICES else [f for f in self.functions if f["name"] == self.choice]
        body = json.dumps({"anyOf": [_call_schema(f) for f in called],
                           "x-guidance": {"whitespace_flexible": False}})  # compact: what the parser reads
        calls = 'call ("\\n" call)*' if self.parallel else "call"
        start = "TEXT | calls" if self.choice == "auto" else "calls"
        return (f"start: {start}\ncalls: {calls}\n"
                f'call: "{TAG}\\n" body "\\n{END_TAG}"\nbody: %json {body}\n'
                f"TEXT: /{_not_starting_with(TAG)}/\n")


def _json_list(text: str) -> list[Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValidationError("tools", f"not valid JSON: {exc}") from None
    check(isinstance(value, list) and bool(value), "tools", "must be a non-empty list of tools")
    return value


def _function(tool: Any, i: int) -> dict[str, Any]:
    function = tool.get("function") if isinstance(tool, dict) else None
    check(isinstance(tool, dict) and tool.get("type", "function") == "function" and isinstance(function, dict),
          "tools", f"tool {i}: must be {{\"type\": \"function\", \"function\": {{\"name\", \"parameters\"}}}}")
    name = function.get("name")  # type: ignore[union-attr]
    check(isinstance(name, str) and NAME.fullmatch(name) is not None, "tools",
          f"tool {i}: the name must be 1 to 64 letters, digits, _ or -, got {name!r}")
    parameters = function.get("parameters") or {"type": "object", "properties": {}}  # type: ignore[union-attr]
    check(isinstance(parameters, dict) and parameters.get("type", "object") == "object", "tools",
          f"tool {i} ({name}): parameters must be a JSON schema of an object")
    return {"name": name, "description": function.get("description") or "",  # type: ignore[union-attr]
            "parameters": parameters}


def _call_schema(function: dict[str, Any]) -> dict[str, Any]:
    """A call of this function. Its arguments hold only the declared parameters unless the
    schema says otherwise (as OpenAI's strict mode): what the caller's code will read."""
    arguments = {"additionalProperties": False, **function["parameters"]}
    return {"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
            "properties": {"name": {"const": function["name"]}, "arguments": arguments}}


def _not_starting_with(tag: str) -> str:
    """A regex (Rust syntax, as a Lark /.../) of any text that does not start with `tag`: it
    leaves the tag at the first character that differs, or is a proper prefix of it."""
    escape = {"\n": "\\n", "/": "\\/"}

    def lit(c: str) -> str:
        return escape.get(c, re.escape(c))
    differs = ""
    for c in reversed(tag):
        differs = f"[^{lit(c)}]" if not differs else f"[^{lit(c)}]|{lit(c)}({differs})"
    prefix = ""
    for c in reversed(tag[1:-1]):  # proper prefixes only
        prefix = f"({lit(c)}{prefix})?"
    return f"({differs})(.|\\n)*|{lit(tag[0])}{prefix}"


def tool_spec(params: Any) -> Optional[ToolSpec]:
    """The request's tools (SamplingParams), validated; None when it asks for no calls."""
    return ToolSpec.parse(params.tools, params.tool_choice, params.parallel_tool_calls)


# ----- rendering -----
def render_messages(messages: list[dict[str, Any]], spec: Optional[ToolSpec]) -> list[dict[str, Any]]:
    """The generic rendering, for templates that know no tools: the tools in a system message,
    an assistant's calls as the call blocks it would have written, a tool's result as a user
    turn in <tool_response> (templates often refuse a `tool` role)."""
    out = []
    for m in messages:
        if m["role"] == "assistant" and m.get("tool_calls"):
            calls = "\n".join(f"{TAG}\n{json.dumps(call)}\n{END_TAG}" for call in m["tool_calls"])
            out.append({"role": "assistant", "content": "\n".join(filter(None, [m.get("content"), calls]))})
        elif m["role"] == "tool":
            out.append({"role": "user", "content": f"<tool_response>\n{m['content']}\n</tool_response>"})
        else:
            out.append({"role": m["role"], "content": m["content"]})
    if spec is not None:
        tools = "\n".join(json.dumps({"type": "function", "function": f}) for f in spec.functions)
        preamble = PREAMBLE.format(tools=tools)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + preamble}
        else:
            out.insert(0, {"role": "system", "content": preamble})
    return out


def openai_tools(spec: ToolSpec) -> list[dict[str, Any]]:
    """The tools as a template that takes `tools=` reads them (OpenAI's shape)."""
    return [{"type": "function", "function": f} for f in spec.functions]


# ----- the answer, as it streams -----
@dataclass
class ToolCallDelta:
    """Part of a call: its first part has the id and the name, the next ones the arguments'
    text as it comes (joined, they are the call's arguments, byte for byte)."""

    index: int
    id: str = ""
    name: str = ""
    arguments: str = ""


@dataclass
class ToolCallParser:
    """Splits an answer's text into plain text and calls, fed as it is generated. The grammar
    has shaped the text already (compact JSON, `name` then `arguments`), so this only reads."""

    auto: bool
    call_id: Callable[[int], str] = lambda index: f"call_{uuid.uuid4().hex[:24]}"  # a call's id, by its index
    calls: int = 0  # calls started
    _held: str = ""  # auto: a start that may still become a call
    _mode: str = "undecided"  # undecided | text | calls
    _rest: str = ""  # call text not yet read
    _stage: Generator[None, None, None] = field(init=False, repr=False)
    _out: list[ToolCallDelta] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._mode = "undecided" if self.auto else "calls"
        self._stage = self._read_calls()

    def feed(self, text: str) -> tuple[str, list[ToolCallDelta]]:
        """(the plain text to stream now, the call deltas this text completes)."""
        if self._mode == "undecided":
            self._held += text
            if self._held.startswith(TAG):
                self._mode, text = "calls", self._held
            elif not TAG.startswith(self._held):
                self._mode, text = "text", self._held
            else:
                return "", []
        if self._mode == "text":
            return text, []
        self._rest += text
        next(self._stage)
        out, self._out = self._out, []
        return "", merged(out)

    def finish(self) -> str:
        """At the end: held text that never became a call is plain text after all."""
        held, self._held = (self._held, "") if self._mode == "undecided" else ("", "")
        return held

    @property
    def called(self) -> bool:
        return self.calls > 0

    def _take(self, n: int) -> Generator[None, None, str]:
        """Wait (yield) until n characters are there, then the text they form."""
        while len(self._rest) < n:
            yield None
        text, self._rest = self._rest[:n], self._rest[n:]
        return text

    def _read_calls(self) -> Generator[None, None, None]:
        opening = f'{TAG}\n{{"name":"'
        while True:
            yield from self._take(len(opening))
            name = ""
            while True:
                c = yield from self._take(1)
                if c == '"':
                    break
                name += c
            index, self.calls = self.calls, self.calls + 1
            self._out.append(ToolCallDelta(index, self.call_id(index), name))
            yield from self._take(len(',"arguments":'))
            yield from self._read_arguments(index)
            yield from self._take(len(f"}}\n{END_TAG}\n"))

    def _read_arguments(self, index: int) -> Generator[None, None, None]:
        """The arguments' JSON, passed on as it arrives, until its outermost value closes."""
        depth, in_string, escaped = 0, False, False
        while True:
            while not self._rest:
                yield None
            taken = 0
            for c in self._rest:
                taken += 1
                if in_string:
                    escaped, in_string = (False, True) if escaped else (c == "\\", c != '"')
                elif c == '"':
                    in_string = True
                elif c in "{[":
                    depth += 1
                elif c in "}]":
                    depth -= 1
                    if depth == 0:
                        break
            piece, self._rest = self._rest[:taken], self._rest[taken:]
            self._out.append(ToolCallDelta(index, arguments=piece))
            if depth == 0 and not in_string:
                return


def merged(deltas: list[ToolCallDelta]) -> list[ToolCallDelta]:
    """Consecutive argument pieces of one call as one, in new deltas (the pieces, which outputs
    already sent hold, stay as they were)."""
    out: list[ToolCallDelta] = []
    for d in deltas:
        if out and out[-1].index == d.index and not d.id:
            out[-1].arguments += d.arguments
        else:
            out.append(replace(d))
    return out
