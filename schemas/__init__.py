"""The typed documents that flow through the service (DocArray v2).

Every request option lives in PromptDocument: Jina drops `parameters` on
streaming endpoints. Types and wire ranges only here; the engine validates values
and names the offending field, the same way for every transport.

Wire facts: DocArray's protobuf carries an `int` as int32, so every integer field is
bounded to int32 when a document is built (a larger value is a validation error that
names the field, not a serialization failure mid-stream), and the 64-bit `seed`
travels as decimal text (see `Seed`).
"""
from typing import Annotated, Any, List, Optional

from docarray import BaseDoc
from docarray.base_doc.base_node import BaseNode
from pydantic import Field, GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic_core import core_schema

from executors.engine.limits import SEED_MAX  # the engine's declaration; imports nothing heavy

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


class PromptDocument(BaseDoc):
    prompt: str = ""
    max_tokens: Int32 = 64
    do_sample: bool = False
    temperature: float = 1.0
    top_k: Int32 = 0
    top_p: float = 1.0
    typical_p: float = 1.0
    repetition_penalty: float = 1.0
    seed: Optional[Seed] = None
    stop: List[str] = []
    # Chat: a JSON list of {role, content}; when set it replaces `prompt`, and the engine
    # renders it (chat template, or a plain format) and drops the oldest turns to fit.
    messages: str = ""


class ModelOutputDocument(BaseDoc):
    """One streamed step: a token (several when the reader fell behind), or an error."""

    token_id: Int32 = -1  # the last token of this document
    token_ids: List[Int32] = []  # every token this document covers
    text: str = ""  # only this document's new text
    generated_text: str = ""  # all text so far
    index: Int32 = 0  # position of token_id in the generation
    logprob: float = 0.0
    logprobs: List[float] = []
    special: bool = False  # whether token_id is a special token
    specials: List[bool] = []  # the same for each of token_ids
    finish_reason: Optional[str] = None  # last document only: length | eos_token | stop_sequence | error
    generated_tokens: Optional[Int32] = None  # last document only
    prompt_tokens: Optional[Int32] = None  # last document only
    seed: Optional[Seed] = None  # last document only, when sampling
    error: Optional[str] = None  # set on a final error document
    error_type: Optional[str] = None  # validation | overloaded | generation
    error_field: Optional[str] = None  # the request field a validation error is about


__all__ = ["INT32_MAX", "INT32_MIN", "SEED_MAX", "ModelOutputDocument", "PromptDocument", "Seed"]
