"""The typed documents that flow through the service (DocArray v2).

Every request option lives in PromptDocument: Jina drops `parameters` on
streaming endpoints. Its fields are the engine's request fields (SamplingParams in
contract/params.py), with their wire types; the engine validates values
and names the offending field, the same way for every transport.

Wire facts: DocArray's protobuf carries an `int` as int32, so every integer field is
bounded to int32 when a document is built (a larger value is a validation error that
names the field, not a serialization failure mid-stream), and the 64-bit `seed`
travels as decimal text (see `Seed`).

ModelOutputDocument is built from OUTPUT_FIELDS, which declares each field once: its wire
type, its order, and what of the engine's output (RequestOutput) it shows on which documents;
the executor's conversion (executors/convert.py) reads the same rows.
"""
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Annotated, Any, Optional

from docarray import BaseDoc
from docarray.base_doc.base_node import BaseNode
from docarray.typing import NdArray
from pydantic import Field, GetCoreSchemaHandler, GetJsonSchemaHandler, ValidationError, create_model
from pydantic_core import core_schema

from contract import (
    SEED_MAX,  # the engine's declarations: nothing heavy
    field_type,
    item_type,
    request_fields,
)

from .wire import FlatDoc

INT32_MIN, INT32_MAX = -2**31, 2**31 - 1

Int32 = Annotated[int, Field(ge=INT32_MIN, le=INT32_MAX)]


class Seed(int, BaseNode):
    """A seed from 0 to 2**64 - 1: an int in Python and JSON, decimal text on DocArray's
    protobuf wire (whose integers are int32). An int32 `integer` node is read too."""

    @classmethod
    def _validate(cls, value: Any) -> "Seed":
        if isinstance(value, str) and value.isascii() and value.isdigit():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError("must be an integer (decimal text on the protobuf wire)")
        if not 0 <= value <= SEED_MAX:
            raise ValueError(f"must be between 0 and 2**64 - 1, got {value}")
        return cls(value)

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler):
        return core_schema.no_info_plain_validator_function(
            cls._validate, serialization=core_schema.plain_serializer_function_ser_schema(int))

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: Any, handler: GetJsonSchemaHandler) -> dict:
        return {"type": "integer", "minimum": 0, "maximum": SEED_MAX}

    def _to_node_protobuf(self):
        from docarray.proto import NodeProto
        return NodeProto(text=str(int(self)))

    @classmethod
    def from_protobuf(cls, pb_msg: Any) -> "Seed":
        return cls._validate(pb_msg)

    def _docarray_to_json_compatible(self) -> int:
        return int(self)


def _wire_type(f: Any) -> Any:
    """A request field's type on DocArray's wire: int32 integers, the seed as uint64 text."""
    kind, optional = field_type(f)
    items = list[Int32] if kind is list and item_type(f) is int else list[str]  # token ids, or strings
    wire = {int: Seed if f.metadata.get("le", 0) > INT32_MAX else Int32, list: items}.get(kind, kind)
    return Optional[wire] if optional else wire


# Every request option lives in the document (Jina drops `parameters` on streaming endpoints):
# the prompt, the engine's request fields as SamplingParams declares them, and chat messages.
if TYPE_CHECKING:  # what mypy sees of the model built below (one made at import has no static type)
    class PromptDocument(FlatDoc):
        prompt: str
        prompt_token_ids: list[int]
        messages: str

        def __init__(self, **fields: Any) -> None: ...

        def __getattr__(self, name: str) -> Any: ...  # the engine's request fields
else:
    PromptDocument = create_model(
        "PromptDocument", __base__=FlatDoc, __module__=__name__,
        prompt=(str, Field("", description="the text to continue; ignored when `messages` or `prompt_token_ids` "
                                           "is set")),
        prompt_token_ids=(list[Int32], Field([], description=(
            "the prompt as token ids (the model's own tokenizer's), instead of `prompt` or `messages` (refused "
            "beside them)"))),
        **{f.name: (_wire_type(f), Field(default=[] if field_type(f)[0] is list else f.default,
                                         description=f.metadata["help"]))
           for f in request_fields()},
        messages=(str, Field("", description=(
            "chat: a JSON list of {role, content}; it replaces `prompt`, and the engine renders it "
            "(the model's chat template, or a plain format) and drops the oldest turns to fit"))),
    )


def _empty() -> Any:
    """An empty list default, made per document by `list()`: pydantic deep-copies a `[]` default
    for every document it builds, and ModelOutputDocument's twenty of them made building one take
    34 µs instead of 9.5 on a 2-core machine; each token's document is built three times (the
    executor, the gateway, the client)."""
    return Field(default_factory=list)


class Shown(Enum):
    """Which of an answer's documents carry an output field; the others leave it at its default."""

    EVERY = "every"
    FIRST_AND_LAST = "first and last"  # the first: for usage streamed up front
    LAST = "last"  # the answer's last (its finish_reason set)


@dataclass(frozen=True)
class OutputField:
    """One field of ModelOutputDocument: its type on DocArray's wire, and which field of the
    engine's output (RequestOutput's `source`, merged by that field's own rule) it carries,
    through `value`. `source` None: the executor sets it apart (the text so far, an error's)."""

    name: str
    kind: Any  # every integer is Int32 (or a Seed, as text); a list's default is a fresh [] per document
    default: Any = None
    source: Optional[str] = None
    value: Optional[Callable[[Any], Any]] = None  # None: the source's value as it is
    shown: Shown = Shown.EVERY
    # a list that only some requests fill: left off the wire when empty (read as []), and left at its
    # default when its source is empty (None, or no items)
    sparse: bool = False


def _last(default: Any) -> Callable[[list], Any]:
    """The last token's, of a per-token list."""
    return lambda values: values[-1] if values else default


def _parts(attribute: str) -> Callable[[list], list]:
    """A tool call part's attribute, for each part."""
    return lambda parts: [getattr(part, attribute) for part in parts]


def _counts(alternatives: list[list]) -> list[int]:
    return [len(token) for token in alternatives]


def _column(i: int) -> Callable[[list[list[tuple]]], list]:
    """Each token's alternatives (id, text, log probability), flat: the i-th of each."""
    return lambda alternatives: [a[i] for token in alternatives for a in token]


def _scores(attribute: str, then: Optional[Callable[[Any], list]] = None) -> Callable[[Any], list]:
    """A PromptScores' attribute (token_ids, texts, logprobs, alternatives), through `then`."""
    def value(prompt: Any) -> list:
        if prompt is None:
            return []
        got = getattr(prompt, attribute)
        return got if then is None else then(got)
    return value


# ModelOutputDocument's fields, in their order on the wire and in JSON: one streamed step, a token
# (several when the reader fell behind), or an error. An engine output field the reader sees has
# its rows here (executors/convert.py checks that each one has).
OUTPUT_FIELDS: tuple[OutputField, ...] = (
    OutputField("token_id", Int32, -1, "token_ids", _last(-1)),  # the last token of this document
    OutputField("token_ids", list[Int32], source="token_ids"),  # every token this document covers
    OutputField("text", str, "", "texts", "".join),  # only this document's new text (of the answer)
    # only this document's new reasoning text: a reasoning model's thoughts, apart
    OutputField("reasoning", str, "", "thoughts", "".join),
    OutputField("generated_text", str, ""),  # all text so far (the executor's)
    OutputField("index", Int32, 0, "index"),  # position of token_id in the generation
    OutputField("choice_index", Int32, 0, "choice"),  # which of the request's n answers this document belongs to
    OutputField("logprob", float, 0.0, "logprobs", _last(0.0)),
    OutputField("logprobs", list[float], source="logprobs"),
    OutputField("special", bool, False, "special", _last(False)),  # whether token_id is a special token
    OutputField("specials", list[bool], source="special"),  # the same for each of token_ids
    OutputField("texts", list[str], source="texts"),  # each token's new text, for each of token_ids: joined, `text`
    # logprobs/top_logprobs: each token's text alone (tokens), and its likeliest alternatives,
    # flat: alternative_counts[i] of them for token i, in order (ids, texts, log probabilities)
    OutputField("tokens", list[str], source="token_strs", sparse=True),
    OutputField("alternative_counts", list[Int32], source="alternatives", value=_counts, sparse=True),
    OutputField("alternative_ids", list[Int32], source="alternatives", value=_column(0), sparse=True),
    OutputField("alternative_texts", list[str], source="alternatives", value=_column(1), sparse=True),
    OutputField("alternative_logprobs", list[float], source="alternatives", value=_column(2), sparse=True),
    # parts of tool calls, one entry per part across the four lists: a call's first part has its
    # id and name, the next ones pieces of its arguments (JSON text, joined in order)
    OutputField("tool_call_indexes", list[Int32], source="tool_calls", value=_parts("index"), sparse=True),
    OutputField("tool_call_ids", list[str], source="tool_calls", value=_parts("id"), sparse=True),
    OutputField("tool_call_names", list[str], source="tool_calls", value=_parts("name"), sparse=True),
    OutputField("tool_call_arguments", list[str], source="tool_calls", value=_parts("arguments"), sparse=True),
    # prompt_logprobs, on each answer's first document: the prompt's tokens (ids, each one's text
    # alone), the log probability of each from the second on, and their alternatives (flat, as above)
    OutputField("prompt_token_ids", list[Int32], source="prompt", value=_scores("token_ids"), sparse=True),
    OutputField("prompt_token_texts", list[str], source="prompt", value=_scores("texts"), sparse=True),
    OutputField("prompt_logprobs", list[float], source="prompt", value=_scores("logprobs"), sparse=True),
    OutputField("prompt_alternative_counts", list[Int32], source="prompt", value=_scores("alternatives", _counts),
                sparse=True),
    OutputField("prompt_alternative_ids", list[Int32], source="prompt", value=_scores("alternatives", _column(0)),
                sparse=True),
    OutputField("prompt_alternative_texts", list[str], source="prompt", value=_scores("alternatives", _column(1)),
                sparse=True),
    OutputField("prompt_alternative_logprobs", list[float], source="prompt", value=_scores("alternatives", _column(2)),
                sparse=True),
    # each answer's last: length | eos_token | stop_sequence | tool_calls | error
    OutputField("finish_reason", Optional[str], None, "finish_reason",
                lambda reason: None if reason is None else reason.value),
    OutputField("generated_tokens", Optional[Int32], None, "generated_tokens", shown=Shown.LAST),
    # a reasoning model's: of generated_tokens, the thinking's
    OutputField("reasoning_tokens", Optional[Int32], None, "reasoning_tokens", lambda n: n or None, Shown.LAST),
    OutputField("prompt_tokens", Optional[Int32], None, "prompt_tokens", shown=Shown.FIRST_AND_LAST),
    # prompt tokens reused from the prefix cache
    OutputField("cached_tokens", Optional[Int32], None, "cached_tokens", shown=Shown.FIRST_AND_LAST),
    # when a stop sequence ended the answer: which one
    OutputField("stop_sequence", Optional[str], None, "stop_sequence", shown=Shown.LAST),
    OutputField("seed", Optional[Seed], None, "seed", shown=Shown.LAST),  # when sampling
    # the executor's: how long the request waited for its model to load (Ollama's load_duration); none: it
    # was loaded
    OutputField("load_seconds", Optional[float], None),
    OutputField("error", Optional[str]),  # set on a final error document
    OutputField("error_type", Optional[str]),  # validation | overloaded | unprocessable | generation
    OutputField("error_field", Optional[str]),  # the request field a validation error is about
)


_OUTPUT_DOC = "One streamed step: a token (several when the reader fell behind), or an error."


def output_document(name: str, declared: tuple[OutputField, ...]) -> type[FlatDoc]:
    """The document class of these output fields, in their order (ModelOutputDocument's, or
    a test's with fields of its own)."""
    def default(f: OutputField) -> Any:
        return _empty() if typing.get_origin(f.kind) is list else f.default

    definitions: dict[str, Any] = {f.name: (f.kind, default(f)) for f in declared}
    model = create_model(name, __base__=FlatDoc, __module__=__name__, __doc__=_OUTPUT_DOC, **definitions)
    model.sparse_lists = frozenset(f.name for f in declared if f.sparse)
    return model


if TYPE_CHECKING:  # what mypy sees of the class built below (OUTPUT_FIELDS names the fields)
    class ModelOutputDocument(FlatDoc):
        def __init__(self, **fields: Any) -> None: ...

        def __getattr__(self, name: str) -> Any: ...
else:
    ModelOutputDocument = output_document("ModelOutputDocument", OUTPUT_FIELDS)


# what pydantic adds to an error's location for the member of a union that failed: int, list[str]...
_UNION_TAG = re.compile(r"(int|float|str|bool|list|dict|none)(\[.*\])?|.*[\[\-].*")


class EmbeddingDocument(BaseDoc):
    """One input of the embedding endpoint, DocArray's native shape: `text` (or the model's
    `token_ids`, used as they are) in, its float32 `embedding` and the tokens it took out; or an
    error naming the field. A request is a DocList of them, one per input, in order."""

    text: str = ""
    token_ids: list[Int32] = []
    truncate: bool = True  # an input longer than the model takes is cut there; false: refused
    embedding: Optional[NdArray] = None
    prompt_tokens: Optional[Int32] = None
    error: Optional[str] = None
    error_type: Optional[str] = None
    error_field: Optional[str] = None


def named_error(exc: ValidationError) -> tuple[str, str]:
    """(field, "field: message") for pydantic's first error, as every edge reports it."""
    first = exc.errors()[0]
    where = ".".join(str(x) for x in first["loc"] if not _UNION_TAG.fullmatch(str(x)))
    return where, f"{where}: {first['msg'].removeprefix('Value error, ')}"


__all__ = ["INT32_MAX", "INT32_MIN", "OUTPUT_FIELDS", "SEED_MAX", "EmbeddingDocument", "ModelOutputDocument",
           "OutputField", "PromptDocument", "Seed", "Shown", "named_error", "output_document"]
