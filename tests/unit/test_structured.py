"""Structured output in the engine: every finished answer is valid, constraints do not depend
on the batch or on how a reader takes the stream, and bad grammars are refused naming the
field before any token."""
import asyncio
import json
import random

import jsonschema
import pytest

from contract import FinishReason, RequestLimits, SamplingParams, ValidationError
from tests.unit.test_batching import collect, mixed_requests, settled

# bounded, so that even a random model finishes it
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "ok", "n"],
          "properties": {"name": {"type": "string", "maxLength": 6}, "ok": {"type": "boolean"},
                         "n": {"type": "integer", "minimum": 0, "maximum": 99}}}
CONSTRAINTS = [{"json_schema": json.dumps(SCHEMA)}, {"json_object": True}, {"regex": "[a-z]{2,5}-[0-9]{2}"},
               {"choice": ["red", "green", "blue"]}, {"grammar": 'root ::= "say " ("yes" | "no") "."'}]


def valid(constraint: dict, text: str) -> bool:
    import re
    (field, value), = constraint.items()
    if field == "json_schema":
        jsonschema.validate(json.loads(text), json.loads(value))
        return True
    if field == "json_object":
        return isinstance(json.loads(text), dict)
    if field == "regex":
        return re.fullmatch(value, text) is not None
    if field == "choice":
        return text in value
    return re.fullmatch(r"say (yes|no)\.", text) is not None


@pytest.mark.parametrize("constraint", CONSTRAINTS, ids=lambda c: next(iter(c)))
async def test_every_finished_answer_is_valid(any_model, make_engine, constraint):
    engine = make_engine(any_model)
    finished = 0
    for i, sample in enumerate([False, True, True, True]):
        params = SamplingParams(max_tokens=48, do_sample=sample, seed=i, **constraint)
        _, text, reason = await collect(engine, "the quick brown fox", params)
        if reason == FinishReason.LENGTH:  # cut short: never called valid
            continue
        assert reason == FinishReason.EOS and valid(constraint, text), text
        finished += 1
    assert finished >= 1 or "json_object" in constraint  # a random model may ramble in an open object


@pytest.mark.parametrize("sample", [False, True], ids=["greedy", "seeded"])
async def test_constrained_rows_batched_equal_alone(any_model, make_engine, sample):
    engine = make_engine(any_model, max_prefill_tokens=16)
    plain = mixed_requests(8, seed=3, sample=sample)
    rng = random.Random(5)
    constrained = [("a b c " * rng.randint(1, 6), SamplingParams(max_tokens=rng.randint(8, 40), do_sample=sample,
                                                                  seed=50 + i, **c))
                   for i, c in enumerate(CONSTRAINTS * 2)]
    requests = plain + constrained
    alone = [await collect(engine, p, params) for p, params in requests]
    together = await asyncio.gather(*(collect(engine, p, params) for p, params in requests))
    assert together == alone
    stats = await settled(engine)
    assert stats["running"] == stats["running"] == stats["kv_blocks_used"] == 0


async def test_a_slow_reader_gets_the_same_text_in_fewer_chunks(gpt2_model, make_engine):
    engine = make_engine(gpt2_model)
    params = SamplingParams(max_tokens=60, json_schema=json.dumps(SCHEMA))
    fast = await collect(engine, "hello", params)
    chunks = []
    async for chunk in engine.generate("hello", params):
        chunks.append(chunk)
        await asyncio.sleep(0.03)
    assert any(len(c.token_ids) > 1 for c in chunks)
    assert ([t for c in chunks for t in c.token_ids], "".join(c.text for c in chunks)) == fast[:2]


async def test_max_tokens_and_stop_sequences_still_end_a_constrained_answer(gpt2_model, make_engine):
    engine = make_engine(gpt2_model)
    ids, text, reason = await collect(engine, "hello", SamplingParams(max_tokens=3, json_schema=json.dumps(SCHEMA)))
    assert reason == FinishReason.LENGTH and len(ids) == 3
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)
    _, text, reason = await collect(engine, "hello", SamplingParams(max_tokens=20, regex="abcabcabc", stop=["ca"]))
    assert (text, reason) == ("ab", FinishReason.STOP)


@pytest.mark.parametrize(("fields", "field", "reason"), [
    ({"json_schema": "{not json"}, "json_schema", ""),
    ({"json_schema": json.dumps({"type": "object", "properties": {"a": {"$ref": "#/nope"}}})}, "json_schema", "nope"),
    ({"regex": "a(b"}, "regex", "unclosed group"),
    ({"grammar": "start: foo"}, "grammar", "foo"),
    ({"grammar": 'root ::= "a" ('}, "grammar", ""),
    ({"choice": ["a", ""]}, "choice", "non-empty"),
    ({"regex": "a", "choice": ["a"]}, "choice", "only one"),
    ({"json_object": True, "json_schema": "{}"}, "json_object", "only one"),
])
async def test_a_bad_constraint_is_refused_naming_the_field(gpt2_model, make_engine, fields, field, reason):
    engine = make_engine(gpt2_model)
    with pytest.raises(ValidationError) as err:
        await engine.open("hello", SamplingParams(max_tokens=8, **fields))
    assert err.value.field == field and reason in str(err.value), str(err.value)
    assert engine.stats()["waiting"] == 0


def test_grammar_size_is_bounded_before_it_is_read():
    limits = RequestLimits(max_grammar_bytes=100)
    with pytest.raises(ValidationError) as err:
        SamplingParams(regex="a" * 101).validate(100, limits)
    assert err.value.field == "regex" and "LLM_MAX_GRAMMAR_BYTES" in str(err.value)


async def test_a_grammar_is_compiled_once(gpt2_model, make_engine):
    engine = make_engine(gpt2_model)
    params = SamplingParams(max_tokens=4, json_schema=json.dumps(SCHEMA))
    assert not engine.core.grammars.cached(params)
    await collect(engine, "hi", params)
    assert engine.core.grammars.cached(params)
