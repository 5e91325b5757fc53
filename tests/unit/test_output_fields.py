"""An output field is declared once, with its merge rule (engine/outputs.py's RequestOutput) and
the document fields that show it (schemas' OUTPUT_FIELDS): coalescing a slow reader's tokens,
the executor's conversion and the document's schema all follow from those declarations, so a
field added there survives each of them without another line of code."""
import asyncio
from dataclasses import dataclass, field, fields
from typing import Optional

import pytest

from contract import FinishReason
from engine.frontend.streams import RequestStream
from engine.outputs import FIRST, LAST, TOKENS, RequestOutput, merge_rules
from executors.convert import check_shown, document_fields, to_document
from schemas import OUTPUT_FIELDS, Int32, ModelOutputDocument, OutputField, Shown, output_document


@dataclass
class ScoredOutput(RequestOutput):
    """Three fields more, one of each merge rule."""

    scores: list[float] = field(default_factory=list, metadata=TOKENS)
    label: Optional[str] = field(default=None, metadata=FIRST)
    steps: int = field(default=0, metadata=LAST)


SCORED_FIELDS = OUTPUT_FIELDS + (
    OutputField("scores", list[float], None, "scores", sparse=True),
    OutputField("score_count", Int32, 0, "scores", len),
    OutputField("label", Optional[str], None, "label"),
    OutputField("steps", Optional[Int32], None, "steps", shown=Shown.LAST),
)
ScoredDocument = output_document("ScoredDocument", SCORED_FIELDS)


def _token(i: int, finish: Optional[FinishReason] = None) -> ScoredOutput:
    return ScoredOutput("r", [10 + i], [f"t{i}"], [-0.5 * i], [False], i, finish, generated_tokens=i + 1,
                        scores=[i / 10], label="first" if i == 1 else None, steps=100 + i)


async def test_a_slow_readers_coalesced_tokens_keep_a_new_field_by_its_rule():
    stream = RequestStream("r", asyncio.get_running_loop())
    for i in range(4):  # pushed while the reader sleeps: taken as one chunk
        stream.push(_token(i, FinishReason.LENGTH if i == 3 else None))
    chunk = await stream.next_chunk()
    assert type(chunk) is ScoredOutput
    assert (chunk.token_ids, chunk.text, chunk.index) == ([10, 11, 12, 13], "t0t1t2t3", 3)
    assert (chunk.scores, chunk.label, chunk.steps) == ([0.0, 0.1, 0.2, 0.3], "first", 103)


def test_a_new_field_reaches_the_document_as_declared_and_crosses_the_wire():
    parts = [_token(i) for i in range(3)]
    middle = ScoredDocument(generated_text="so far", **document_fields(ScoredOutput.merge(parts), SCORED_FIELDS))
    assert (middle.scores, middle.score_count, middle.label, middle.steps) == ([0.0, 0.1, 0.2], 3, "first", None)
    last = ScoredDocument(**document_fields(_token(3, FinishReason.EOS), SCORED_FIELDS))
    assert (last.scores, last.score_count, last.label, last.steps, last.finish_reason) == (
        [0.3], 1, None, 103, "eos_token")
    for doc in (middle, last):
        assert ScoredDocument.from_protobuf(doc.to_protobuf()) == doc
    assert "scores" in ScoredDocument.sparse_lists
    assert "scores" not in ScoredDocument(**document_fields(ScoredOutput("r"), SCORED_FIELDS)).to_protobuf().data
    assert list(ScoredDocument.model_fields)[-4:] == ["scores", "score_count", "label", "steps"]


def test_the_document_is_built_from_its_declaration_in_its_order():
    assert list(ModelOutputDocument.model_fields) == ["id"] + [f.name for f in OUTPUT_FIELDS]
    assert ModelOutputDocument.sparse_lists == {f.name for f in OUTPUT_FIELDS if f.sparse}
    out = RequestOutput("r", [5, 6], ["a", "b"], [-0.1, -0.2], [False, True], 1, FinishReason.STOP, prompt_tokens=3,
                        generated_tokens=2, seed=2**64 - 1, stop_sequence="b", reasoning_tokens=0)
    doc = to_document(out, "ab")
    assert (doc.token_id, doc.text, doc.logprob, doc.special, doc.finish_reason, doc.seed, doc.reasoning_tokens,
            doc.prompt_tokens) == (6, "ab", -0.2, True, "stop_sequence", 2**64 - 1, None, 3)


def test_every_field_declares_how_it_merges_and_where_it_shows():
    check_shown()  # the executor's own check, as it loads: every output field reaches a document
    rules = merge_rules(RequestOutput)
    assert sorted([name for name, _ in rules.tokens] + [*rules.first, *rules.last]) == sorted(
        f.name for f in fields(RequestOutput))

    @dataclass
    class Unruled(RequestOutput):
        extra: int = 0

    with pytest.raises(TypeError, match="Unruled.extra declares no merge rule"):
        Unruled.merge([Unruled("r")])
    with pytest.raises(TypeError, match=r"no document field shows \['label', 'scores', 'steps'\]"):
        check_shown(ScoredOutput)  # declared for merge, shown nowhere: refused, not lost
    with pytest.raises(TypeError, match=r"no output field is \['label', 'scores', 'steps'\]"):
        check_shown(RequestOutput, SCORED_FIELDS)
    check_shown(ScoredOutput, SCORED_FIELDS)
