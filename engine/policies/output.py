"""A row's output pipeline (vLLM's OutputProcessor, one per row): a chosen token in, what the
client sees of it out. Detokenize, tell thoughts from the answer (reasoning.py), advance the
grammar, find stop sequences, read tool calls,
attach log probabilities, and decide whether the answer ends (`finish_reason`, the one place
where the order of the finish reasons is written).

It changes only its own policies' state (detokenizer, grammar matcher, stop filter, tool
parser); the row's state (tokens, counts, blocks) is the scheduler's. A resumed request replays
the tokens it had through the same pipeline, so that what follows is what an uncut run streams.
"""
import hashlib
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from contract import FinishReason, SamplingParams, ValidationError

from .detokenizer import IncrementalDetokenizer, byte_fallback_ids
from .logprobs import Alternative, TokenTexts, raw_logprob
from .reasoning import ReasoningMarkers, ReasoningParser
from .stopping import StopSequenceFilter
from .structured import grammar_complete
from .tools import ToolCallDelta, ToolCallParser


@dataclass(frozen=True)
class Vocabulary:
    """What every row's pipeline reads of the model's tokenizer, built once per engine."""

    tokenizer: Any
    byte_ids: frozenset[int]  # held by the detokenizer until their run ends
    special_ids: frozenset[int]
    eos_ids: frozenset[int]
    texts: TokenTexts
    reasoning: Optional[ReasoningMarkers] = None  # the model's think markers, where it has them

    @classmethod
    def of(cls, tokenizer: Any, eos_ids: frozenset[int], texts: TokenTexts, reasoning: str) -> "Vocabulary":
        """`reasoning`: EngineConfig.reasoning (the think markers: auto, off, or OPEN,CLOSE)."""
        return cls(tokenizer, byte_fallback_ids(tokenizer), frozenset(tokenizer.all_special_ids), eos_ids, texts,
                   ReasoningMarkers.of(tokenizer, reasoning))


@dataclass
class TokenPiece:
    """One token's share of an output: its text (maybe "", held back), log probability,
    alternatives, the tool-call parts it completes, and whether the answer ends with it.

    Each field names the RequestOutput field it fills (`metadata["output"]`, read by
    core/rows.py's `row_output`): a per-token list gets one entry per token (none where the
    value is None: not asked for), or the token's `parts`; any other field, the value."""

    token_id: int = field(metadata={"output": "token_ids"})
    text: str = field(metadata={"output": "texts"})  # of the answer
    logprob: float = field(metadata={"output": "logprobs"})
    special: bool = field(metadata={"output": "special"})
    # logprobs or top_logprobs: the token's text alone
    token_str: Optional[str] = field(default=None, metadata={"output": "token_strs"})
    alternatives: Optional[list[Alternative]] = field(default=None, metadata={"output": "alternatives"})
    tool_calls: list[ToolCallDelta] = field(default_factory=list, metadata={"output": "tool_calls", "parts": True})
    finish: Optional[FinishReason] = field(default=None, metadata={"output": "finish_reason"})
    # the one that ended the answer (finish STOP)
    stop_sequence: Optional[str] = field(default=None, metadata={"output": "stop_sequence"})
    reasoning: str = field(default="", metadata={"output": "thoughts"})  # its text when it is a thought (reasoning.py)
    # the answer's thinking tokens so far, this one included
    reasoning_tokens: int = field(default=0, metadata={"output": "reasoning_tokens"})


def finish_reason(stop_hit: bool, eos: bool, length: bool, grammar_done: bool,
                  tool_called: bool) -> Optional[FinishReason]:
    """Which reason ends the answer when several hold at one token: a stop sequence in the text
    first; then the end-of-sequence token, the length, and a complete grammar; an answer that
    ends (eos or grammar) after calling tools ends in tool calls."""
    if stop_hit:
        return FinishReason.STOP
    if eos or (grammar_done and not length):
        return FinishReason.TOOL_CALLS if tool_called else FinishReason.EOS
    return FinishReason.LENGTH if length else None


class OutputPipeline:
    def __init__(self, vocab: Vocabulary, params: SamplingParams, prompt_ids: list[int], matcher: Any = None,
                 tools: bool = False, tools_auto: bool = False, turn_markers: tuple[str, ...] = ()):
        """`turn_markers`: the chat format's, which end the answer as its end-of-turn token would
        (so `ignore_eos` goes past them too)."""
        self.vocab, self.params, self.matcher = vocab, params, matcher
        self.constraint = params.constraint()[0] if matcher is not None else None  # type: ignore[index]
        self.detokenizer = IncrementalDetokenizer(vocab.tokenizer, vocab.byte_ids)
        self.stops = StopSequenceFilter(params.stop, () if params.ignore_eos else turn_markers)
        self.tools = ToolCallParser(auto=tools_auto, call_id=self._call_id) if tools else None
        self.reasoning = ReasoningParser(vocab.reasoning, prompt_ids, params.reasoning_budget)
        self._prompt_digest = hashlib.blake2b(repr(prompt_ids).encode(), digest_size=16).digest()
        self.count = 0  # tokens through the pipeline

    @property
    def asks_logprobs(self) -> bool:
        return self.params.logprobs or self.params.top_logprobs > 0

    def token(self, token_id: int, logits: torch.Tensor, logprob: Optional[float]) -> TokenPiece:
        """The next token of the answer. logits: its row [vocab] (masked as it was chosen from);
        logprob: the plain greedy rows' own, already computed. Raises when this row fails."""
        text, calls, finish, thought = self._advance(token_id)
        top = self.params.top_logprobs
        alternatives = None
        if logprob is None or top:
            logprob, alternatives = raw_logprob(logits, token_id, top, self.vocab.texts)
        asked = self.asks_logprobs
        return TokenPiece(token_id, text, logprob, token_id in self.vocab.special_ids,
                          self.vocab.texts(token_id) if asked else None, (alternatives or []) if asked else None, calls,
                          finish, self.stops.hit if finish is FinishReason.STOP else None, thought,
                          self.reasoning.tokens)

    @property
    def thinking(self) -> bool:
        """Whether the next token is a thought: no grammar applies to it."""
        return self.reasoning.inside

    @property
    def forced(self) -> Optional[int]:
        """The token the next step must choose (the close marker of a spent reasoning budget)."""
        return self.reasoning.forced

    def replay(self, tokens: list[int]) -> None:
        """A resumed request's tokens so far, through every policy, their output dropped (it was
        streamed already). Refused, naming the field, when the answer had ended."""
        for token_id in tokens:
            if self._advance(token_id)[2] is not None:
                raise ValidationError("resume_tokens", f"the answer ends at token {self.count - 1} of the "
                                                       f"{len(tokens)} given: nothing is left to generate")

    def _advance(self, token_id: int) -> tuple[str, list[ToolCallDelta], Optional[FinishReason], str]:
        """(the answer's text, tool-call parts, the finish reason, the thought's text) of a token."""
        self.count += 1
        eos = token_id in self.vocab.eos_ids and not self.params.ignore_eos
        length = self.count >= self.params.max_tokens
        if self.reasoning.feed(token_id):  # a thought, or a marker: before the answer's policies
            ended = eos or length or not self.reasoning.inside  # the answer, or the thinking (its close)
            delta = self.detokenizer.add(token_id) + (self.detokenizer.flush() if ended else "")
            return "", [], finish_reason(False, eos, length, False, False), self.reasoning.strip(delta)
        grammar_done = self._grammar(token_id)
        ending = eos or length or grammar_done
        delta = self.detokenizer.add(token_id) + (self.detokenizer.flush() if ending else "")
        text, stop_hit = self.stops.add(delta)
        if ending and not stop_hit:
            text += self.stops.flush()
        calls: list[ToolCallDelta] = []
        if self.tools is not None:
            text, calls = self.tools.feed(text)
            if ending or stop_hit:
                text += self.tools.finish()
        called = self.tools is not None and self.tools.called
        turn_end = stop_hit and self.stops.turn_ended  # the chat format's next turn: its end of turn
        return text, calls, finish_reason(stop_hit and not turn_end, eos or turn_end, length, grammar_done, called), ""

    def _grammar(self, token_id: int) -> bool:
        """Advance the grammar; whether it is complete. A token it refuses ends this row alone,
        with llguidance's reason, naming the constraint's field."""
        if self.matcher is None:
            return False
        try:
            return grammar_complete(self.matcher, token_id)
        except RuntimeError as exc:
            raise ValidationError(self.constraint or "grammar", str(exc)) from None

    def _call_id(self, index: int) -> str:
        """A call's id: a function of the prompt and the tokens before the call, so that a
        resumed request names its calls as the uncut run would."""
        digest = hashlib.blake2b(self._prompt_digest + repr((self.detokenizer.ids, index)).encode(), digest_size=12)
        return f"call_{digest.hexdigest()}"
