"""Reasoning: the thoughts a model writes between its markers (`<think>` ... `</think>`), told
apart from its answer by token ids, in the output pipeline, so that every protocol gets them
apart (OpenAI's `reasoning`, Anthropic's thinking blocks, Ollama's `thinking`) without parsing
text.

The markers are the model's: "auto" takes `<think>` and `</think>` when its chat template names
the first and each is one token of its vocabulary; LLM_REASONING may name two others ("OPEN,CLOSE"),
or turn it off ("off"). A request thinks from its prompt's start when the chat template left a
think block open at the end of the prompt, or from the moment the model writes the open marker.
While it thinks, its tokens are reasoning: no grammar, stop sequence or tool call applies to them
(they apply to the answer after the close marker), and a `reasoning_budget` of thinking tokens,
once spent, forces the close marker as the next token. The markers themselves are in neither text.
"""
from dataclasses import dataclass
from typing import Any, Optional

from contract import ValidationError

from ..model.decoding_tokenizer import with_merges

AUTO_MARKERS = ("<think>", "</think>")


@dataclass(frozen=True)
class ReasoningMarkers:
    open_id: int
    close_id: int
    open_text: str
    close_text: str

    @classmethod
    def of(cls, tokenizer: Any, setting: str) -> Optional["ReasoningMarkers"]:
        """The model's markers for EngineConfig.reasoning: "auto", "off", or "OPEN,CLOSE" (None: off)."""
        if setting == "off":
            return None
        if setting == "auto":
            template = getattr(tokenizer, "chat_template", None)
            if not isinstance(template, str) or AUTO_MARKERS[0] not in template:
                return None
            texts = AUTO_MARKERS
        else:
            texts = tuple(m.strip() for m in setting.split(","))  # type: ignore[assignment]
            if len(texts) != 2 or not all(texts):
                raise ValidationError("reasoning", f"must be auto, off, or the open and close markers as OPEN,CLOSE; "
                                                   f"got {setting!r}")
        ids = [_one_token(tokenizer, text) for text in texts]
        if None in ids:
            if setting == "auto":
                return None
            raise ValidationError("reasoning", f"each marker must be one token of the model's vocabulary: {setting!r}")
        return cls(ids[0], ids[1], texts[0], texts[1])  # type: ignore[arg-type]


def _one_token(tokenizer: Any, text: str) -> Optional[int]:
    ids = with_merges(tokenizer).encode(text, add_special_tokens=False)
    return ids[0] if len(ids) == 1 else None


class ReasoningParser:
    """One answer's thinking state: whether its next token is a thought, and the close marker
    it must take once its budget is spent."""

    def __init__(self, markers: Optional[ReasoningMarkers], prompt_ids: list[int], budget: Optional[int]):
        self.markers, self.budget = markers, budget
        self.inside = markers is not None and _left_open(prompt_ids, markers)
        self.thought = 0  # thinking tokens so far, the markers not counted
        self.tokens = 0  # tokens of the thinking, its markers counted: the answer's reasoning tokens

    @property
    def forced(self) -> Optional[int]:
        """The token the next step must choose: the close marker, once the budget is spent."""
        if self.inside and self.budget is not None and self.thought >= self.budget:
            assert self.markers is not None
            return self.markers.close_id
        return None

    def feed(self, token_id: int) -> bool:
        """Whether this token is part of the thinking (a marker, or a thought)."""
        markers = self.markers
        if markers is None:
            return False
        if not self.inside:
            self.inside = token_id == markers.open_id
            self.tokens += self.inside
            return self.inside
        self.tokens += 1
        if token_id == markers.close_id:
            self.inside = False
        else:
            self.thought += 1
        return True

    def strip(self, text: str) -> str:
        """A thought's text without a marker's (where the markers are not special tokens)."""
        assert self.markers is not None
        return text.replace(self.markers.open_text, "").replace(self.markers.close_text, "")


def _left_open(prompt_ids: list[int], markers: ReasoningMarkers) -> bool:
    """Whether the prompt ends inside a think block (the chat template opened one)."""
    opened = max((i for i, t in enumerate(prompt_ids) if t == markers.open_id), default=-1)
    closed = max((i for i, t in enumerate(prompt_ids) if t == markers.close_id), default=-1)
    return opened > closed
