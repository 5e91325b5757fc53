"""A request continued from (prompt, seed, tokens so far) in a fresh engine produces what the
uncut run produced after those tokens, token for token and byte for byte: sampling draws are a
function of (seed, position), and the tokens so far are replayed through every policy."""
import json

import pytest

from contract import SamplingParams, ValidationError
from engine import RequestOutput
from tests.unit.test_speculation import looping_llama  # noqa: F401 - the fixture
from tests.unit.test_structured import SCHEMA

TOOLS = json.dumps([{"type": "function", "function": {"name": "lookup", "parameters": {
    "type": "object", "properties": {"q": {"type": "string", "maxLength": 3}}, "required": ["q"]}}}])
KINDS = {
    "plain": dict(do_sample=True, seed=11, temperature=1.3),
    "penalties": dict(do_sample=True, seed=12, repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.4),
    "min_p": dict(do_sample=True, seed=13, min_p=0.02, top_k=50, top_p=0.95),
    "structured": dict(do_sample=True, seed=14, json_schema=json.dumps(SCHEMA)),
    "tool_calls": dict(do_sample=True, seed=15, tools=TOOLS, tool_choice="required", max_tokens=48),
    "speculative": dict(do_sample=True, seed=16, temperature=0.05, speculative_tokens=4, max_tokens=48),
    "greedy_speculative": dict(speculative_tokens=4, top_logprobs=2, max_tokens=48),
    "stop": dict(do_sample=True, seed=17, stop=["e t", "zz"], logprobs=True),
}
PROMPT = "the cat sat on the mat and the cat sat on the"


def per_token(outs: list[RequestOutput]) -> list[tuple]:
    """What a reader sees of each token (a failure or the end included)."""
    rows = []
    for out in outs:
        assert out.error is None, out.error
        calls = [(c.index, c.id, c.name, c.arguments) for c in out.tool_calls]
        for i, token in enumerate(out.token_ids):
            last = i == len(out.token_ids) - 1
            rows.append((out.index - len(out.token_ids) + 1 + i, token, out.texts[i], out.logprobs[i],
                         out.alternatives[i] if out.alternatives else None, calls if last else [],
                         out.finish_reason if last else None))
    return rows


def without_calls(rows: list[tuple]) -> list[tuple]:
    return [row[:5] + row[6:] for row in rows]


def calls(rows: list[tuple]) -> list[tuple]:
    """The tool calls that the rows' fragments add up to: (index, id, name, arguments joined), what
    a reader holds whichever tokens shared a chunk (per_token puts a chunk's fragments on its last
    token, and how tokens share chunks depends on how fast the reader is)."""
    joined: dict[int, list[str]] = {}
    for row in rows:
        for index, call_id, name, arguments in row[5]:
            joined.setdefault(index, [call_id, name, ""])[2] += arguments
    return sorted((index, *call) for index, call in joined.items())


async def run(engine, params: SamplingParams) -> list[RequestOutput]:
    return [out async for out in await engine.open(PROMPT, params)]


@pytest.mark.parametrize("kind", KINDS)
async def test_a_request_continued_from_its_tokens_goes_on_as_if_never_cut(kind, looping_llama, make_engine):  # noqa: F811
    """On an int4 model with the C kernels, where a token's numbers do not depend on how its
    history was computed (one prefill, or step by step): log probabilities equal too. The model
    favours a dozen tokens, so that its answers repeat and drafts are confirmed."""
    params = {"max_tokens": 24, "ignore_eos": True, **KINDS[kind]}
    engine = make_engine(looping_llama)
    uncut = per_token(await run(engine, SamplingParams(**params)))
    assert len(uncut) > 6, uncut
    if kind == "tool_calls":  # the cut falls before the call and inside it
        assert any(row[5] for row in uncut[5:]) and calls(uncut), uncut
    if "speculative" in kind:
        assert engine.stats()["spec_accepted_tokens"] > 0
    for cut in (1, 5, len(uncut) // 2):
        fresh = make_engine(looping_llama)
        tokens = [row[1] for row in uncut[:cut]]
        resumed = per_token(await run(fresh, SamplingParams(**params, resume_tokens=tokens)))
        assert without_calls(resumed) == without_calls(uncut[cut:]), (kind, cut)
        assert calls(uncut[:cut] + resumed) == calls(uncut), (kind, cut)
        fresh.shutdown()


async def test_a_continued_request_is_refused_naming_the_field_when_it_cannot_go_on(gpt2_model, make_engine):
    engine = make_engine(gpt2_model)
    cases = [(dict(max_tokens=3), [1, 2, 3]), (dict(max_tokens=8), [10 ** 9]), (dict(max_tokens=8), ["1"]),
             (dict(max_tokens=8, do_sample=True), [1]), (dict(max_tokens=8, n=2, seed=1, do_sample=True), [1])]
    for params, tokens in cases:
        with pytest.raises(ValidationError) as err:
            await engine.open(PROMPT, SamplingParams(**params, resume_tokens=tokens))
        assert err.value.field == "resume_tokens", (params, str(err.value))


async def test_a_continued_request_counts_only_its_prompt_as_cached(looping_llama, make_engine):  # noqa: F811
    """The prefix cache can hold the prompt and the answer's first tokens; a request continued
    from them computes none of those again, but what it reports as cached is of its prompt (the
    usage an unbroken run reports: Anthropic's input_tokens are the prompt less what was cached)."""
    params = {"max_tokens": 40, "ignore_eos": True}
    engine = make_engine(looping_llama)
    uncut = await run(engine, SamplingParams(**params))
    tokens = [t for out in uncut for t in out.token_ids]
    prompt = uncut[-1].prompt_tokens
    assert prompt + len(tokens) >= prompt // 16 * 16 + 32, "the answer fills a block of its own"
    again = await run(engine, SamplingParams(**params, resume_tokens=tokens[:-1]))
    assert again[-1].prompt_tokens == prompt
    assert prompt // 16 * 16 <= again[-1].cached_tokens <= prompt, (again[-1].cached_tokens, prompt)
