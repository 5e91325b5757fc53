"""What every protocol decides alike, written once: a reasoning effort's budget, how long an answer
is when the client does not say, whether a request is sampled, and how a stream goes on from what
it has already handed its client (a stop given as one string is inputs.py's `stop_list`).

Each protocol reads its own field names and words its own shapes; the decision behind them lives
here, so that two protocols can never drift apart on it (an effort that one maps to 1024 tokens
and another to 4096, a sampled request that one seeds and the other does not).
"""
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Optional

from contract import SamplingParams, ServerInfo
from contract.limits import REASONING_EFFORT_BUDGETS
from gateway.mapping.inputs import BadRequest


def effort_budget(effort: Any, named: str, param: Optional[str] = None, also: str = "") -> dict[str, Any]:
    """A reasoning effort ("none" ... "high") as the engine's thinking budget (`reasoning_budget`;
    None: no effort asked, no key). Any other value is refused, named as the request named it
    (`named`, `param` the field the error points at), after the other values the protocol
    accepts there (`also`, Ollama's "true, false or ")."""
    if effort is None:
        return {}
    if not isinstance(effort, str) or effort not in REASONING_EFFORT_BUDGETS:
        raise BadRequest(f"{named}: {also}one of {', '.join(REASONING_EFFORT_BUDGETS)}, got {effort!r}",
                         param or named)
    return {"reasoning_budget": REASONING_EFFORT_BUDGETS[effort]}


def default_max_tokens(info: ServerInfo) -> int:
    """An answer's length when the client gives none and its API means "as long as it takes"
    (OpenAI chat and Responses, Ollama): half the model's context, within the server's limit, so
    that the prompt keeps the other half."""
    return min(info.max_tokens_limit, info.max_context // 2)


async def max_tokens_or_default(asked: Optional[int], model: Optional[str],
                                info: Callable[[Optional[str]], Awaitable[ServerInfo]]) -> int:
    """The length the client asked for, or the named model's default length (`info` is the
    backend's: it is asked only when the client gave none)."""
    return asked if asked is not None else default_max_tokens(await info(model))


def sampled(do_sample: Optional[bool], temperature: Optional[float] = None) -> bool:
    """Whether a request samples (rather than decoding greedily), as the engine decides it
    (SamplingParams.greedy: do_sample, and a temperature other than 0); None: the field unsent."""
    given: dict[str, Any] = {"do_sample": bool(do_sample)}
    if temperature is not None:
        given["temperature"] = temperature
    return not SamplingParams(**given).greedy


class Handed:
    """What a stream has handed its client, so that a new call can go on from it: the tokens (after
    those the request itself went on from, its `resume_tokens`) and the text. A call that goes on
    reports its `generated_text` from where it started; `generated_text` puts the text handed
    before it in front, so the client sees all the text so far, as from an unbroken call."""

    def __init__(self, resume_tokens: Sequence[int] = ()):
        self.before = list(resume_tokens)  # what the request went on from: a new call does too
        self.tokens: list[int] = []  # handed on since
        self.text = ""
        self.prefix = ""  # the text handed before the current call started
        self.resumes = 0

    def sent(self, token_ids: Sequence[int], text: str) -> None:
        """A document on its way to the client: its tokens and text are the client's now."""
        self.tokens += token_ids
        self.text += text

    def resume_tokens(self) -> list[int]:
        """The next call's `resume_tokens`: all the tokens so far. From now on, that call's texts
        go on from the text handed so far."""
        self.prefix, self.resumes = self.text, self.resumes + 1
        return self.before + self.tokens

    def generated_text(self, text: str) -> str:
        """A document's `generated_text` (all text so far, as its call counts it) as the client's."""
        return self.prefix + text
