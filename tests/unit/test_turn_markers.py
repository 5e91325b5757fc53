"""A model without a chat template answers chat in the plain format and stops at its next turn
marker (engine/frontend/chat.py), beside the request's own stop sequences.

The tiny models write random text, so a regular expression makes them write the marker: the
grammar forces the tokens, the turn marker then ends the answer as it would end a base model's."""
import asyncio

import pytest
from transformers import AutoTokenizer

from contract import FinishReason, SamplingParams
from engine.frontend.chat import TURN_MARKERS, turn_markers
from engine.policies.stopping import StopSequenceFilter
from tests.unit.test_chat_template import TEMPLATE

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


async def answer(engine, params: SamplingParams, messages=QUESTION, prompt: str = ""):
    """(the streamed chunks' texts, the whole text, the last output)."""
    chunks = [c async for c in await engine.open(prompt, params, messages)]
    texts = [c.text for c in chunks]
    return texts, "".join(texts), chunks[-1]


def forced(regex: str, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=40, regex=regex, **kw)


def test_markers_only_where_the_plain_format_is_rendered(gpt2_model, llama_model):
    plain = AutoTokenizer.from_pretrained(gpt2_model)
    assert not plain.chat_template and turn_markers(plain) == TURN_MARKERS
    assert {"\nUser:", "\n\nUser:", "\nAssistant:", "\nSystem:"} <= set(TURN_MARKERS)
    templated = AutoTokenizer.from_pretrained(llama_model)
    templated.chat_template = TEMPLATE
    assert turn_markers(templated) == ()


@pytest.mark.parametrize("turn", ["\\nUser: and Italy\\?", "\\n\\nUser: and Italy\\?", "\\nAssistant: Yes\\."])
async def test_the_next_turn_ends_the_answer_unseen(gpt2_model, make_engine, turn):
    engine = make_engine(gpt2_model)
    texts, text, last = await answer(engine, forced(f"Paris\\.{turn}"))
    assert text == "Paris."  # no trailing newline either, after a blank line
    assert not any(":" in t for t in texts), "a part of the turn marker was streamed"
    assert last.finish_reason == FinishReason.EOS and last.stop_sequence is None


async def test_a_prompt_and_ignore_eos_go_past_the_marker(gpt2_model, make_engine):
    engine = make_engine(gpt2_model)
    whole = "Paris.\nUser: and Italy?"
    regex = "Paris\\.\\nUser: and Italy\\?"
    _, text, last = await answer(engine, forced(regex), messages=None, prompt="The capital of France is")
    assert (text, last.finish_reason) == (whole, FinishReason.EOS)  # the grammar's end: no chat, no marker
    _, text, _ = await answer(engine, forced(regex, ignore_eos=True))
    assert text == whole


async def test_the_requests_own_stops_apply_beside_the_markers(gpt2_model, make_engine):
    engine = make_engine(gpt2_model)
    _, text, last = await answer(engine, forced("Paris\\.\\nUser: x", stop=["ris"]))
    assert (text, last.finish_reason, last.stop_sequence) == ("Pa", FinishReason.STOP, "ris")
    # a request's stop that is also a marker is the request's: reported by name
    _, text, last = await answer(engine, forced("Paris\\.\\nUser: x", stop=["\nUser:"]))
    assert (text, last.finish_reason, last.stop_sequence) == ("Paris.", FinishReason.STOP, "\nUser:")


async def test_batched_equals_alone(gpt2_model, make_engine):
    engine = make_engine(gpt2_model)
    requests = [forced("Paris\\.\\nUser: x"), SamplingParams(max_tokens=12, ignore_eos=True),
                forced("Rome\\.\\n\\nSystem: y", n=2, do_sample=True, seed=3),
                SamplingParams(max_tokens=12, ignore_eos=True, stop=["e"])]

    async def run(params: SamplingParams) -> list[tuple[int, str, FinishReason]]:
        """Each answer's (choice, text, finish reason)."""
        chunks = [c async for c in await engine.open("", params, QUESTION)]
        return [(choice, "".join(c.text for c in chunks if c.choice == choice),
                 next(c.finish_reason for c in chunks if c.choice == choice and c.finish_reason))
                for choice in range(params.n)]
    alone = [await run(params) for params in requests]
    together = await asyncio.gather(*(run(params) for params in requests))
    assert list(together) == alone
    assert alone[0] == [(0, "Paris.", FinishReason.EOS)]
    assert alone[2] == [(0, "Rome.", FinishReason.EOS), (1, "Rome.", FinishReason.EOS)]


def test_filter_tells_a_marker_from_a_requests_stop():
    f = StopSequenceFilter(["zz"], TURN_MARKERS)
    out = [f.add(d) for d in ("Paris.", "\n", "\n", "Us", "er:")]
    assert out == [("Paris.", False), ("", False), ("", False), ("", False), ("", True)]
    assert f.turn_ended and f.hit is None
    f = StopSequenceFilter(["zz"], TURN_MARKERS)
    assert f.add("a zz") == ("a ", True) and (f.hit, f.turn_ended) == ("zz", False)
