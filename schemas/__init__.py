"""The typed documents that flow through the service (DocArray v2).

Every request option lives in PromptDocument: Jina drops `parameters` on
streaming endpoints. Its fields are the engine's request fields (SamplingParams in
contract/params.py), with their wire types; the engine validates values
and names the offending field, the same way for every transport.

Wire facts: DocArray's protobuf carries an `int` as int32, so every integer field is
bounded to int32 when a document is built (a larger value is a validation error that
names the field, not a serialization failure mid-stream), and the 64-bit `seed`
travels as decimal text (see `Seed`).
"""
import re
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Optional

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


class ModelOutputDocument(FlatDoc):
    """One streamed step: a token (several when the reader fell behind), or an error."""

    # what only some requests ask for stays off the wire when empty (a missing field reads as [])
    sparse_lists: ClassVar[frozenset[str]] = frozenset({
        "tokens", "alternative_counts", "alternative_ids", "alternative_texts", "alternative_logprobs",
        "tool_call_indexes", "tool_call_ids", "tool_call_names", "tool_call_arguments",
        "prompt_token_ids", "prompt_token_texts", "prompt_logprobs", "prompt_alternative_counts",
        "prompt_alternative_ids", "prompt_alternative_texts", "prompt_alternative_logprobs"})

    token_id: Int32 = -1  # the last token of this document
    token_ids: list[Int32] = _empty()  # every token this document covers
    text: str = ""  # only this document's new text (of the answer)
    reasoning: str = ""  # only this document's new reasoning text: a reasoning model's thoughts, apart
    generated_text: str = ""  # all text so far
    index: Int32 = 0  # position of token_id in the generation
    choice_index: Int32 = 0  # which of the request's n answers this document belongs to
    logprob: float = 0.0
    logprobs: list[float] = _empty()
    special: bool = False  # whether token_id is a special token
    specials: list[bool] = _empty()  # the same for each of token_ids
    texts: list[str] = _empty()  # each token's new text, for each of token_ids: they join to `text`
    # logprobs/top_logprobs: each token's text alone (tokens), and its likeliest alternatives,
    # flat: alternative_counts[i] of them for token i, in order (ids, texts, log probabilities)
    tokens: list[str] = _empty()
    alternative_counts: list[Int32] = _empty()
    alternative_ids: list[Int32] = _empty()
    alternative_texts: list[str] = _empty()
    alternative_logprobs: list[float] = _empty()
    # parts of tool calls, one entry per part across the four lists: a call's first part has its
    # id and name, the next ones pieces of its arguments (JSON text, joined in order)
    tool_call_indexes: list[Int32] = _empty()
    tool_call_ids: list[str] = _empty()
    tool_call_names: list[str] = _empty()
    tool_call_arguments: list[str] = _empty()
    # prompt_logprobs, on each answer's first document: the prompt's tokens (ids, each one's text
    # alone), the log probability of each from the second on, and their alternatives (flat, as above)
    prompt_token_ids: list[Int32] = _empty()
    prompt_token_texts: list[str] = _empty()
    prompt_logprobs: list[float] = _empty()
    prompt_alternative_counts: list[Int32] = _empty()
    prompt_alternative_ids: list[Int32] = _empty()
    prompt_alternative_texts: list[str] = _empty()
    prompt_alternative_logprobs: list[float] = _empty()
    finish_reason: Optional[str] = None  # each answer's last: length | eos_token | stop_sequence | tool_calls | error
    generated_tokens: Optional[Int32] = None  # each answer's last document only
    reasoning_tokens: Optional[Int32] = None  # last document, a reasoning model's: of generated_tokens, the thinking's
    prompt_tokens: Optional[Int32] = None  # each answer's first and last documents
    cached_tokens: Optional[Int32] = None  # first and last: prompt tokens reused from the prefix cache
    stop_sequence: Optional[str] = None  # each answer's last, when a stop sequence ended it: which one
    seed: Optional[Seed] = None  # last document only, when sampling
    error: Optional[str] = None  # set on a final error document
    error_type: Optional[str] = None  # validation | overloaded | unprocessable | generation
    error_field: Optional[str] = None  # the request field a validation error is about


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


__all__ = ["INT32_MAX", "INT32_MIN", "SEED_MAX", "EmbeddingDocument", "ModelOutputDocument", "PromptDocument", "Seed",
           "named_error"]
