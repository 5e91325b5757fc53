"""Requests in: JSON bodies read strictly, the request limits checked first, and the
PromptDocument built; every refusal is a BadRequest that names the field.

The protocols' request models take the engine's request fields (SamplingParams) under
their own names where the protocol has one, and as extensions where it has none
(`option_fields`), so a field declared in the engine reaches every protocol.
"""
import json
from collections.abc import Collection, Sequence
from dataclasses import Field
from typing import Any, Optional, TypeVar, Union

from fastapi import Request
from pydantic import BaseModel, StrictBool, StrictFloat, StrictInt, StrictStr, ValidationError
from pydantic import Field as ModelField

from contract import ErrorKind, RequestLimits, field_type, item_type, request_fields
from contract import ValidationError as LimitError
from schemas import PromptDocument, named_error

ModelT = TypeVar("ModelT", bound=BaseModel)
LIMITS = RequestLimits.from_env()  # the executor reads the same variables

# Request-model field types that do not coerce: JSON true is not 1, "0.5" is not 0.5
Int = Optional[StrictInt]
Number = Optional[StrictFloat]  # an integer is a number (1 -> 1.0), a string is not
Bool = Optional[StrictBool]
Stop = Optional[Union[str, list[str]]]  # a string or a list, as OpenAI and TGI accept
Text = Optional[StrictStr]
Ids = Optional[list[StrictInt]]  # token ids
_STRICT = {int: Int, float: Number, bool: Bool, list: Stop, str: Text}


class BadRequest(ValueError):
    """A request refused before any work: one that does not parse (`param` names the field when
    there is one), or one for a model not served (NOT_FOUND)."""

    def __init__(self, message: str, param: Optional[str] = None, kind: ErrorKind = ErrorKind.VALIDATION):
        super().__init__(message)
        self.param = param
        self.kind = kind


def bad_request(exc: ValidationError) -> BadRequest:
    """Pydantic's first error, as `field: message` naming the field."""
    where, message = named_error(exc)
    return BadRequest(message, where)


def parse_json(raw: bytes) -> Any:
    """Any JSON value, refused with a message when it does not parse or nests too deeply."""
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise BadRequest("request body: JSON nested too deeply") from None
    check_text(data)
    return data


async def parse_body(request: Request, model: type[ModelT]) -> ModelT:
    """The body as JSON whatever the Content-Type (curl -d sends form-encoded)."""
    data = parse_json(await request.body())
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise bad_request(exc) from None


def check_text(value: Any, path: str = "") -> None:
    """Every string must be encodable: JSON's `\\\\ud800` escapes decode to lone surrogates,
    which no wire format below can carry. The error names where the bad string is."""
    stack = [(path, value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise BadRequest(f"{where or 'body'}: not valid Unicode text (a lone surrogate)",
                                 where.split(".")[0] or None) from None
        elif isinstance(item, dict):
            stack += [(f"{where}.{k}" if where else str(k), v) for k, v in item.items()]
        elif isinstance(item, list):
            stack += [(f"{where}.{i}", v) for i, v in enumerate(item)]


def prompt_document(**fields: Any) -> PromptDocument:
    """A route's PromptDocument, after the request limits (cheapest first); a value the
    document cannot carry (a seed past 2**64 - 1, an integer past int32) is a BadRequest
    naming the field, before anything is sent. `messages` may be a list. The text was
    checked where the request was parsed (`parse_json`, or the WebSocket's own parse)."""
    try:
        LIMITS.check_prompt(fields.get("prompt"))
        LIMITS.check_stop(fields.get("stop"))
        LIMITS.check_messages(fields.get("messages"))
    except LimitError as exc:
        raise BadRequest(str(exc), exc.field) from None
    if isinstance(fields.get("messages"), list):
        fields["messages"] = json.dumps(fields["messages"])
    if isinstance(fields.get("stop"), str):
        fields["stop"] = stop_list(fields["stop"])
    try:
        return PromptDocument(**fields)
    except ValidationError as exc:
        raise bad_request(exc) from None


def stop_list(stop: Union[str, Sequence[str], None], drop_empty: bool = False) -> list[str]:
    """Stop sequences as the engine takes them, a list: one string is a list of one (as OpenAI, TGI
    and Ollama accept), none an empty list. `drop_empty`: an empty string means no stop (OpenAI's
    and Ollama's clients send ""); where it is kept, the engine refuses it naming `stop`."""
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    return [s for s in stops if s] if drop_empty else stops


def option_fields(exclude: Collection[str] = ()) -> dict[str, Any]:
    """The engine's request fields as optional, strictly typed request-model fields (null:
    the engine's default), for `pydantic.create_model`."""
    return {f.name: (Ids if field_type(f)[0] is list and item_type(f) is int else _STRICT[field_type(f)[0]],
                     ModelField(None, description=f.metadata["help"]))
            for f in request_fields() if f.name not in exclude}


def set_options(model: BaseModel, exclude: Collection[str] = ()) -> dict[str, Any]:
    """The request fields a request set (not null), under the engine's names."""
    return {f.name: getattr(model, f.name) for f in request_fields()
            if f.name not in exclude and getattr(model, f.name, None) is not None}


def sampling_options(model: BaseModel) -> list[Field]:
    """The sampling-only options (warpers) that this request moved off their neutral value."""
    return [f for f in request_fields() if f.metadata.get("warper")
            and getattr(model, f.name, None) not in (None, f.default)]
