"""Every field of both schemas at its extreme values through DocArray's protobuf, and values
past the wire's range refused when the document is built, naming the field. Our short-way
codec (schemas/wire.py) writes DocArray's bytes and reads what DocArray reads."""
import math
import typing

import pytest
from docarray import BaseDoc
from pydantic import ValidationError

from schemas import INT32_MAX, INT32_MIN, SEED_MAX, ModelOutputDocument, PromptDocument, Seed

LONG_TEXT = "ünïcødé 東京 🎉 \x00 \n" * 2000
FLOATS = [0.0, -0.0, 5e-324, 1.7976931348623157e308, -1.7976931348623157e308, math.inf, -math.inf]
# per annotation: the extremes each field must carry exactly
EXTREMES = {
    str: ["", LONG_TEXT],
    int: [INT32_MIN, -1, 0, INT32_MAX],
    float: FLOATS,
    bool: [False, True],
    Seed: [0, 2**31 - 1, 2**31, 2**32, 2**63 - 1, 2**63, SEED_MAX],
}


def _base(annotation):
    """int for Annotated[int, ...], Seed for Optional[Seed], List[x] stays a list of x."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _base(typing.get_args(annotation)[0])
    if origin is typing.Union:
        return _base(next(a for a in typing.get_args(annotation) if a is not type(None)))
    if origin is list:
        return list[_base(typing.get_args(annotation)[0])]
    return annotation


def _cases(schema) -> list[tuple[str, object]]:
    cases = []
    for name, info in schema.model_fields.items():
        if name == "id":
            continue
        base = _base(info.annotation)
        if typing.get_origin(base) is list:
            item = typing.get_args(base)[0]
            cases += [(name, []), (name, list(EXTREMES[item]))]
        else:
            assert base in EXTREMES, f"{schema.__name__}.{name}: no extremes for {base}"
            cases += [(name, v) for v in EXTREMES[base]]
        if not info.is_required() and info.default is None:
            cases.append((name, None))
    return cases


def _same(a, b) -> bool:
    """Equal, and of the same kind: -0.0 is not 0.0, a list compares item by item."""
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, float) and isinstance(b, float):
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    return a == b and type(a) is type(b) or (isinstance(a, int) and a == b)


@pytest.mark.parametrize("schema", [PromptDocument, ModelOutputDocument])
def test_every_field_round_trips_at_its_extremes(schema):
    cases = _cases(schema)
    assert len({name for name, _ in cases}) == len(schema.model_fields) - 1  # every field but id
    for name, value in cases:
        doc = schema(**{name: value})
        back = schema.from_protobuf(doc.to_protobuf())
        got = getattr(back, name)
        assert _same(value, got), (name, value, got)
        assert back.id == doc.id


@pytest.mark.parametrize("schema", [PromptDocument, ModelOutputDocument])
def test_the_short_way_codec_is_docarrays_byte_for_byte(schema):
    """schemas/wire.py: DocArray's bytes written (less the empty `sparse_lists`, which read
    back as their default), its values read, its dicts dumped."""
    docs = [schema(**{name: value}) for name, value in _cases(schema)]
    docs.append(schema(**{name: value for name, value in reversed(_cases(schema))}))  # every field at once
    for doc in docs:
        for mode in ("python", "json"):  # model_dump's short way too (the SSE route's)
            assert doc.model_dump(mode=mode) == BaseDoc.model_dump(doc, mode=mode)
        ours, theirs = doc.to_protobuf(), BaseDoc.to_protobuf(doc)
        for name in schema.sparse_lists:
            if getattr(doc, name) == []:
                del theirs.data[name]
        assert ours.SerializeToString(deterministic=True) == theirs.SerializeToString(deterministic=True), doc
        assert schema.from_protobuf(ours) == doc
        for message in (ours, theirs):
            fast, generic = schema.from_protobuf(message), BaseDoc.from_protobuf.__func__(schema, message)
            assert fast.__dict__.keys() == generic.__dict__.keys()
            for name, value in generic.__dict__.items():
                assert _same(value, fast.__dict__[name]), (name, value, fast.__dict__[name])
    extra = docs[0].to_protobuf()
    extra.data["not_a_field"].text = "ignored, as DocArray ignores it"
    assert schema.from_protobuf(extra) == BaseDoc.from_protobuf.__func__(schema, extra)


@pytest.mark.parametrize("schema,name,value", [
    (PromptDocument, "max_tokens", INT32_MAX + 1), (PromptDocument, "top_k", INT32_MIN - 1),
    (PromptDocument, "seed", SEED_MAX + 1), (PromptDocument, "seed", -1),
    (PromptDocument, "seed", True), (PromptDocument, "seed", 1.5), (PromptDocument, "seed", "12a"),
    (ModelOutputDocument, "token_ids", [0, INT32_MAX + 1]), (ModelOutputDocument, "seed", 2**64),
    (ModelOutputDocument, "generated_tokens", 2**40),
])
def test_values_past_the_wire_range_are_refused_naming_the_field(schema, name, value):
    with pytest.raises(ValidationError) as err:
        schema(**{name: value})
    assert err.value.errors()[0]["loc"][0] == name


def test_seed_is_decimal_text_on_the_wire_and_an_int_in_python_and_json():
    doc = PromptDocument(prompt="x", seed=SEED_MAX)
    node = doc.to_protobuf().data["seed"]
    assert node.WhichOneof("content") == "text" and node.text == str(SEED_MAX)
    assert type(doc.seed) is Seed and doc.seed == SEED_MAX
    assert f'"seed":{SEED_MAX}' in doc.model_dump_json()
    assert PromptDocument.model_json_schema()["properties"]["seed"]["anyOf"][0]["type"] == "integer"
    # an int32 `integer` node, what other languages may send for a small seed, is read too
    proto = doc.to_protobuf()
    proto.data["seed"].integer = 7
    assert PromptDocument.from_protobuf(proto).seed == 7
