"""Structured output under the names each protocol's clients send, mapped onto the
contract's fields (json_schema, json_object, regex, choice, grammar), which the engine
enforces while decoding. Whatever is accepted here is enforced; anything else is refused
naming the field.

OpenAI: `response_format` ({"type": "text" | "json_object" | "json_schema"}; TGI's chat
route's {"type": "json_object", "value": schema} too); vLLM's `structured_outputs`
{json, regex, choice, grammar, json_object} and its older `guided_json`, `guided_regex`,
`guided_choice`, `guided_grammar`; and the contract's own fields as extensions.
TGI: `parameters.grammar` {"type": "json" | "json_schema" | "regex", "value": ...}, and
{"type": "grammar", "value": a Lark or GBNF grammar} as an extension.
"""
import json
from typing import Any, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, ValidationError

from contract.params import constraint_fields
from gateway.mapping.inputs import BadRequest
from schemas import named_error

Schema = Union[dict[str, Any], StrictBool, StrictStr]  # a JSON schema, or its text


class StructuredOutputs(BaseModel):
    """vLLM's `structured_outputs` (and `guided_decoding_params`)."""

    model_config = ConfigDict(extra="forbid")
    json_: Optional[Schema] = Field(None, alias="json")
    regex: Optional[StrictStr] = None
    choice: Optional[list[StrictStr]] = None
    grammar: Optional[StrictStr] = None
    json_object: Optional[StrictBool] = None


class OpenAIStructured(BaseModel):
    """The structured-output fields of an OpenAI request (a mixin of the request models)."""

    response_format: Optional[dict[str, Any]] = None
    structured_outputs: Optional[dict[str, Any]] = None
    guided_json: Optional[Schema] = None
    guided_regex: Optional[StrictStr] = None
    guided_choice: Optional[list[StrictStr]] = None
    guided_grammar: Optional[StrictStr] = None


def schema_text(schema: Any, where: str) -> str:
    if isinstance(schema, str):
        try:
            json.loads(schema)
        except json.JSONDecodeError as exc:
            raise BadRequest(f"{where}: not valid JSON: {exc}", where.split(".")[0]) from None
        return schema
    if not isinstance(schema, (dict, bool)):
        raise BadRequest(f"{where}: must be a JSON schema (an object)", where.split(".")[0])
    return json.dumps(schema)


def response_format(value: dict[str, Any]) -> dict[str, Any]:
    kind = value.get("type")
    if kind == "text":
        return {}
    if kind == "json_object":  # TGI's chat route may carry the schema as `value`
        return {"json_object": True} if value.get("value") is None else {
            "json_schema": schema_text(value["value"], "response_format.value")}
    if kind == "json_schema":
        spec = value.get("json_schema") or {}
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if schema is None and value.get("value") is not None:  # TGI's spelling
            schema = value["value"].get("schema", value["value"]) if isinstance(value["value"], dict) else None
        if schema is None:
            raise BadRequest("response_format.json_schema.schema: required for type json_schema",
                             "response_format")
        return {"json_schema": schema_text(schema, "response_format.json_schema.schema")}
    raise BadRequest(f"response_format.type: must be text, json_object or json_schema, got {kind!r}",
                     "response_format")


def structured_outputs(value: dict[str, Any]) -> dict[str, Any]:
    try:
        spec = StructuredOutputs.model_validate(value)
    except ValidationError as exc:
        where, message = named_error(exc)
        raise BadRequest(f"structured_outputs.{message}", "structured_outputs") from None
    fields: dict[str, Any] = {}
    if spec.json_ is not None:
        fields["json_schema"] = schema_text(spec.json_, "structured_outputs.json")
    for name in ("regex", "choice", "grammar"):
        if getattr(spec, name) is not None:
            fields[name] = getattr(spec, name)
    if spec.json_object:
        fields["json_object"] = True
    return fields


def openai_constraint(req: Any) -> tuple[dict[str, Any], dict[str, str]]:
    """The contract's structured-output fields for an OpenAI request, and the name each came
    under (for errors); more than one way of asking is refused naming the second."""
    asked: list[tuple[str, dict[str, Any]]] = []
    if req.response_format is not None:
        asked.append(("response_format", response_format(req.response_format)))
    if req.structured_outputs is not None:
        asked.append(("structured_outputs", structured_outputs(req.structured_outputs)))
    guided = {"json_schema": req.guided_json, "regex": req.guided_regex, "choice": req.guided_choice,
              "grammar": req.guided_grammar}
    for name, value in guided.items():
        if value is not None:
            text = schema_text(value, "guided_json") if name == "json_schema" else value
            asked.append(("guided_" + ("json" if name == "json_schema" else name), {name: text}))
    for f in constraint_fields():  # the contract's own names, as extensions (tools: OpenAI's own)
        if f.name != "tools" and getattr(req, f.name, None) not in (None, False, []):
            asked.append((f.name, {f.name: getattr(req, f.name)}))
    asked = [(where, fields) for where, fields in asked if fields]
    if len(asked) > 1:
        names = ", ".join(where for where, _ in asked)
        raise BadRequest(f"{asked[1][0]}: one structured-output constraint per request, got {names}", asked[1][0])
    if not asked:
        return {}, {}
    where, fields = asked[0]
    return fields, {name: where for name in fields}


class TGIGrammar(BaseModel):
    """TGI's `parameters.grammar`."""

    model_config = ConfigDict(extra="forbid")
    type: StrictStr
    value: Any


def tgi_constraint(grammar: Optional[TGIGrammar]) -> dict[str, Any]:
    """The contract's structured-output field for TGI's grammar (errors name it `grammar`)."""
    if grammar is None:
        return {}
    if grammar.type in ("json", "json_object"):
        return {"json_schema": schema_text(grammar.value, "grammar.value")}
    if grammar.type == "json_schema":  # newer TGI: {"name", "schema"}
        value = grammar.value.get("schema", grammar.value) if isinstance(grammar.value, dict) else grammar.value
        return {"json_schema": schema_text(value, "grammar.value")}
    if grammar.type in ("regex", "grammar"):  # grammar (Lark or GBNF): an extension
        if not isinstance(grammar.value, str):
            raise BadRequest(f"grammar.value: a {grammar.type} must be a string", "grammar")
        return {grammar.type: grammar.value}
    raise BadRequest(f"grammar.type: must be json, json_schema, regex or grammar, got {grammar.type!r}", "grammar")
