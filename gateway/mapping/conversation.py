"""What the chat protocols share, written once: a conversation in the engine's terms (the messages
the engine renders: system, user and assistant turns, an assistant's tool calls, a tool's result),
function tools and the tool choice in the contract's terms, an answer's tool calls whole or as they
stream, and usage. OpenAI chat speaks these natively; Anthropic's Messages and OpenAI's Responses
(anthropic_routes.py, responses_routes.py) map their own shapes onto them."""
import json
from dataclasses import dataclass, field
from typing import Any, Optional

from gateway.mapping.inputs import BadRequest
from gateway.mapping.tool_calls import parts, tool_fields, whole_calls
from schemas import ModelOutputDocument

__all__ = ["Conversation", "StreamedCalls", "function_tool", "parts", "tool_choice_fields", "usage_of",
           "whole_calls"]


@dataclass
class Conversation:
    """The engine's messages, built turn by turn (engine/frontend/chat.py renders them)."""

    messages: list[dict[str, Any]] = field(default_factory=list)

    def system(self, text: str) -> None:
        if text:
            self.messages.append({"role": "system", "content": text})

    def user(self, text: str) -> None:
        self.messages.append({"role": "user", "content": text})

    def assistant(self, text: str, calls: Optional[list[tuple[str, str, Any]]] = None) -> None:
        """An assistant's turn: its text and its calls, as (id, name, arguments: an object or JSON)."""
        turn: dict[str, Any] = {"role": "assistant", "content": text}
        if calls:
            turn["tool_calls"] = [{"id": call_id, "type": "function", "function": {
                "name": name, "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments)}}
                for call_id, name, arguments in calls]
        self.messages.append(turn)

    def tool_result(self, call_id: str, text: str) -> None:
        self.messages.append({"role": "tool", "tool_call_id": call_id, "content": text})


def function_tool(name: Any, description: Any, parameters: Any, where: str) -> dict[str, Any]:
    """A function tool as the contract takes it (OpenAI's shape); the engine validates the rest."""
    if not isinstance(name, str):
        raise BadRequest(f"{where}.name: required, a string", where.split(".")[0])
    return {"type": "function", "function": {"name": name, "description": description or "",
                                             "parameters": parameters or {"type": "object", "properties": {}}}}


def tool_choice_fields(tools: list[dict[str, Any]], choice: Optional[str], parallel: Optional[bool]) -> dict[str, Any]:
    """The contract's tools, tool_choice (none, auto, required or a function's name) and
    parallel_tool_calls."""
    fields = tool_fields(tools or None, choice)
    if parallel is not None:
        fields["parallel_tool_calls"] = parallel
    return fields


@dataclass
class StreamedCalls:
    """An answer's calls as they stream: which have started, and each one's arguments so far."""

    started: dict[int, str] = field(default_factory=dict)  # call index -> id
    arguments: dict[int, str] = field(default_factory=dict)

    def feed(self, doc: ModelOutputDocument) -> list[tuple[int, Optional[tuple[str, str]], str]]:
        """This document's call parts: (call index, (id, name) when the call starts here, argument text)."""
        out = []
        for part in parts(doc):
            index, function = part["index"], part["function"]
            start = (part["id"], function["name"]) if "id" in part else None
            if start is not None:
                self.started[index] = part["id"]
            self.arguments[index] = self.arguments.get(index, "") + function["arguments"]
            out.append((index, start, function["arguments"]))
        return out


def usage_of(finals: list[ModelOutputDocument]) -> tuple[int, int, int]:
    """(prompt tokens, of them from the prefix cache, generated tokens) of an answer's last documents."""
    if not finals:
        return 0, 0, 0
    return finals[0].prompt_tokens or 0, finals[0].cached_tokens or 0, sum(d.generated_tokens or 0 for d in finals)
