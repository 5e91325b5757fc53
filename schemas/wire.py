"""DocArray's protobuf (and dict) for flat documents, exactly, without its generic walk.

Every streamed token is a ModelOutputDocument written once (the executor) and read twice (the
gateway, then the client). DocArray's generic `to_protobuf` and `from_protobuf` test each value
against every type it supports: 52 and 96 µs for a final ModelOutputDocument here, against 15
and 24 µs the short way. Scalars, None and lists of scalars, which is all our documents hold,
take the short way below; anything else (a Seed, an ID, a nested document) goes through
DocArray's own code. tests/test_schemas.py checks both ways against DocArray's.

The same goes for `model_dump`, which the SSE route calls per token: DocArray's looks up every
field's annotation for DocList fields on each call (44 µs), and a document without any gives
pydantic's own result (2.4 µs).
"""
from typing import Any, ClassVar, TypeVar

from docarray import BaseDoc
from docarray.base_doc.mixins.io import _type_to_protobuf
from docarray.proto import DocProto, NodeProto
from pydantic import BaseModel

_KEYS = {str: "text", bool: "boolean", int: "integer", float: "float"}  # DocArray's own names
_SCALARS = frozenset(_KEYS.values())

T = TypeVar("T", bound="FlatDoc")


def fill(node: NodeProto, value: Any) -> None:
    """Write value into node as DocArray's `_type_to_protobuf` would build it."""
    key = _KEYS.get(type(value))  # the exact type: subclasses keep DocArray's handling
    if key is not None:
        setattr(node, key, value)
    elif value is None:
        node.SetInParent()
    elif type(value) is list:
        items = node.list.data
        node.list.SetInParent()
        for item in value:
            fill(items.add(), item)
    else:
        node.CopyFrom(_type_to_protobuf(value))


class FlatDoc(BaseDoc):
    """A BaseDoc whose protobuf (de)serialization and model_dump take the short way for plain values."""

    sparse_lists: ClassVar[frozenset[str]] = frozenset()  # list fields left out of the wire when empty

    def to_protobuf(self) -> DocProto:
        """DocArray's message, less the list fields left empty (`sparse_lists`): a reader
        takes a missing field as its default, and a token's document then does not carry
        a dozen empty lists for the options it did not use (tool calls, alternatives)."""
        message = DocProto()
        sparse = type(self).sparse_lists
        for name, value in self:  # as DocArray iterates: the fields, then any extras
            if not (name in sparse and type(value) is list and not value):
                fill(message.data[name], value)
        return message

    def model_dump(self, **kwargs: Any) -> dict[str, Any]:
        if self.is_view() or _doclist_fields(type(self)):
            return super().model_dump(**kwargs)
        return BaseModel.model_dump(self, **kwargs)

    @classmethod
    def from_protobuf(cls: type[T], pb_msg: DocProto) -> T:
        fields = {}
        known = cls._docarray_fields()
        extras = cls.model_config.get("_load_extra_fields_from_protobuf", False)
        for name, node in pb_msg.data.items():
            if extras or name in known:
                fields[name] = _value(cls, name, node)
        return cls(**fields)


_DOCLISTS: dict[type, bool] = {}


def _doclist_fields(cls: type[BaseDoc]) -> bool:
    """Whether DocArray's model_dump would treat any field specially (once per class)."""
    if cls not in _DOCLISTS:
        _DOCLISTS[cls] = bool(cls.model_construct()._exclude_doclist(None)[2])
    return _DOCLISTS[cls]


def _value(cls: type[BaseDoc], name: str, node: NodeProto) -> Any:
    key = node.WhichOneof("content")
    tagged = node.WhichOneof("docarray_type") is not None
    if key == "text" and (not tagged or node.type == "id"):  # ID.from_protobuf only validates
        return node.text
    if not tagged:
        if key in _SCALARS:
            return getattr(node, key)
        if key is None:
            return None
        if key == "list":
            values = []
            for item in node.list.data:  # one pass: plain items, or DocArray's way for all
                kind = item.WhichOneof("content")
                if kind not in _SCALARS or item.WhichOneof("docarray_type") is not None:
                    break
                values.append(getattr(item, kind))
            else:
                return values
    return cls._get_content_from_node_proto(node, name)
