"""OpenAI's tool calls, both ways: `tools` and `tool_choice` onto the contract's fields, and the
documents' call parts onto `message.tool_calls` (whole) or `delta.tool_calls` (streamed).

A streamed call is its first part (index, id, type, name, and arguments so far), then pieces of
its arguments; joined per index they are the whole answer's calls, byte for byte, however the
stream was chunked, since both come from the same parts."""
import json
from typing import Any, Optional

from gateway.mapping.inputs import BadRequest
from schemas import ModelOutputDocument


def tool_fields(tools: Optional[list[Any]], tool_choice: Any) -> dict[str, Any]:
    """The contract's `tools` (JSON text) and `tool_choice` (none, auto, required or a name)."""
    fields: dict[str, Any] = {}
    if tools:
        fields["tools"] = json.dumps(tools)
    if tool_choice is None:
        return fields
    if isinstance(tool_choice, str):
        fields["tool_choice"] = tool_choice
    elif isinstance(tool_choice, dict) and isinstance((tool_choice.get("function") or {}).get("name"), str):
        fields["tool_choice"] = tool_choice["function"]["name"]
    else:
        raise BadRequest('tool_choice: must be none, auto, required or {"type": "function", "function": '
                         '{"name": ...}}', "tool_choice")
    return fields


def parts(doc: ModelOutputDocument) -> list[dict[str, Any]]:
    """This document's call parts, as OpenAI streams them (parts of one call merged)."""
    out: list[dict[str, Any]] = []
    for index, call_id, name, arguments in zip(doc.tool_call_indexes, doc.tool_call_ids, doc.tool_call_names,
                                               doc.tool_call_arguments, strict=True):
        if out and out[-1]["index"] == index and not call_id:
            out[-1]["function"]["arguments"] += arguments
        elif call_id:
            out.append({"index": index, "id": call_id, "type": "function",
                        "function": {"name": name, "arguments": arguments}})
        else:
            out.append({"index": index, "function": {"arguments": arguments}})
    return out


def whole_calls(docs: list[ModelOutputDocument]) -> list[dict[str, Any]]:
    """Every call of an answer, as OpenAI's message.tool_calls."""
    calls: dict[int, dict[str, Any]] = {}
    for doc in docs:
        for part in parts(doc):
            call = calls.setdefault(part["index"], {"id": "", "type": "function",
                                                    "function": {"name": "", "arguments": ""}})
            if "id" in part:
                call["id"], call["function"]["name"] = part["id"], part["function"]["name"]
            call["function"]["arguments"] += part["function"]["arguments"]
    return [calls[i] for i in sorted(calls)]
