"""The engine's one output record: what a request produced since its previous record.

Per-token fields are always lists, so one shape covers one token (the decode loop emits
one per step), a chunk a slow reader takes at once (`merge`), a whole answer (`complete`)
and the error that ends a request (no tokens, `error` set).
"""
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any, Optional

from contract import ErrorKind, FinishReason, GenerationError, RequestFailedError, ValidationError, kind_of

from .policies.tools import ToolCallDelta, merged


class Merge(Enum):
    """How `RequestOutput.merge` makes one field of several consecutive outputs (a slow
    reader's tokens taken at once): every field of RequestOutput declares one, as its
    metadata, and merge reads nothing else."""

    TOKENS = "tokens"  # a per-token list: the outputs' lists joined, in order
    FIRST = "first"  # the first output's value that is not None (what only an answer's first output has)
    LAST = "last"  # the last output's (counts, the finish: the state after the last token)


TOKENS: Mapping[str, Any] = {"merge": Merge.TOKENS}
FIRST: Mapping[str, Any] = {"merge": Merge.FIRST}
LAST: Mapping[str, Any] = {"merge": Merge.LAST}
# off the document: what travels otherwise (an error, as the error document the reader raises)
LAST_OFF_DOCUMENT: Mapping[str, Any] = {"merge": Merge.LAST, "document": False}

Alternative = tuple[int, str, float]  # token id, its text alone, log probability


@dataclass
class PromptScores:
    """token_ids/texts: the whole prompt; logprobs/alternatives: from its second token on
    (the first has nothing before it)."""

    token_ids: list[int]
    texts: list[str]
    logprobs: list[float] = field(default_factory=list)
    alternatives: list[list[Alternative]] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return len(self.logprobs) == len(self.token_ids) - 1


@dataclass
class RequestOutput:
    """Each field declares its merge rule (`Merge`, in its metadata). A field the reader sees
    also needs its row in schemas' OUTPUT_FIELDS (the document's fields, in their wire order),
    which executors/convert.py checks when it loads; `metadata["document"] = False` for one
    that travels otherwise. A token's own fields are filled from the TokenPiece fields that
    name them (policies/output.py, core/rows.py's `row_output`)."""

    request_id: str = field(metadata=LAST_OFF_DOCUMENT)
    token_ids: list[int] = field(default_factory=list, metadata=TOKENS)
    texts: list[str] = field(default_factory=list, metadata=TOKENS)  # each token's new text (may be "": held back)
    logprobs: list[float] = field(default_factory=list, metadata=TOKENS)
    special: list[bool] = field(default_factory=list, metadata=TOKENS)
    index: int = field(default=-1, metadata=LAST)  # position of the last token in the generation
    finish_reason: Optional[FinishReason] = field(default=None, metadata=LAST)
    error: Optional[str] = field(default=None, metadata=LAST_OFF_DOCUMENT)
    # what failed: this request alone (unprocessable, validation) or more
    error_kind: Optional[ErrorKind] = field(default=None, metadata=LAST_OFF_DOCUMENT)
    error_field: Optional[str] = field(default=None, metadata=LAST_OFF_DOCUMENT)  # the field to blame, where one is
    prompt_tokens: int = field(default=0, metadata=LAST)
    generated_tokens: int = field(default=0, metadata=LAST)
    seed: Optional[int] = field(default=None, metadata=LAST)
    # parts of calls, in order (joined, then each call's consecutive parts as one: `merged`)
    tool_calls: list[ToolCallDelta] = field(default_factory=list, metadata={**TOKENS, "then": merged})
    # top_logprobs: each token's likeliest alternatives, (id, its text alone, log probability)
    alternatives: list[list[Alternative]] = field(default_factory=list, metadata=TOKENS)
    token_strs: list[str] = field(default_factory=list, metadata=TOKENS)  # top_logprobs: each token's text alone
    choice: int = field(default=0, metadata=LAST)  # which of the request's n answers
    prompt: Optional[PromptScores] = field(default=None, metadata=FIRST)  # prompt_logprobs: each answer's first
    cached_tokens: int = field(default=0, metadata=LAST)  # prompt tokens served from the prefix cache
    # the stop sequence that ended the answer (finish_reason stop_sequence)
    stop_sequence: Optional[str] = field(default=None, metadata=LAST)
    # each token's new reasoning text (policies/reasoning.py)
    thoughts: list[str] = field(default_factory=list, metadata=TOKENS)
    # of generated_tokens, those of the thinking (its markers too)
    reasoning_tokens: int = field(default=0, metadata=LAST)

    @classmethod
    def failure(cls, request_id: str, error: BaseException | str, index: int = -1, prompt_tokens: int = 0,
                generated_tokens: int = 0, seed: Optional[int] = None, choice: int = 0) -> "RequestOutput":
        """The output that ends a request with an error: a message is a failure beyond the
        request (the step, the loop); an exception, one of the request's own (its kind and field kept)."""
        if isinstance(error, str):
            kind, field_name, message = ErrorKind.GENERATION, None, error
        else:
            kind, field_name = kind_of(error), getattr(error, "field", None)
            kind = ErrorKind.UNPROCESSABLE if kind is ErrorKind.INTERNAL else kind
            message = str(error) if isinstance(error, ValidationError) else f"{type(error).__name__}: {error}"
        return cls(request_id, index=index, finish_reason=FinishReason.ERROR, error=message, error_kind=kind,
                   error_field=field_name, prompt_tokens=prompt_tokens, generated_tokens=generated_tokens, seed=seed,
                   choice=choice)

    def exception(self) -> Exception:
        """A failure output as the exception the reader raises (its kind picks each protocol's code)."""
        message = self.error or "failed"
        if self.error_kind is ErrorKind.VALIDATION and self.error_field:
            prefix = f"{self.error_field}: "
            return ValidationError(self.error_field, message[len(prefix):] if message.startswith(prefix) else message)
        if self.error_kind is ErrorKind.UNPROCESSABLE:
            return RequestFailedError(message, self.error_field)
        return GenerationError(message)

    @property
    def text(self) -> str:
        return "".join(self.texts)

    @property
    def reasoning(self) -> str:
        return "".join(self.thoughts)

    @property
    def ends(self) -> bool:
        """The request's last output: finished, or failed."""
        return self.finish_reason is not None or self.error is not None

    @classmethod
    def merge(cls, outputs: list["RequestOutput"]) -> "RequestOutput":
        """Consecutive outputs of one answer as one, each field by its declared rule (`Merge`), of
        the outputs' own class (a subclass's fields too)."""
        last = outputs[-1]
        rules = merge_rules(type(last))
        values = {name: getattr(last, name) for name in rules.last}
        for name, then in rules.tokens:
            joined: list = []
            for out in outputs:
                joined += getattr(out, name)
            values[name] = joined if then is None else then(joined)
        for name in rules.first:
            values[name] = next((v for out in outputs if (v := getattr(out, name)) is not None), None)
        return type(last)(**values)


@dataclass(frozen=True)
class MergeRules:
    """A class's fields by merge rule, in their order (`then`: what follows a join)."""

    tokens: tuple[tuple[str, Optional[Callable[[list], list]]], ...]
    first: tuple[str, ...]
    last: tuple[str, ...]


_RULES: dict[type, MergeRules] = {}


def merge_rules(cls: type[RequestOutput]) -> MergeRules:
    """The class's fields by merge rule, read once per class; a field without a rule is refused,
    naming it: merge would not know what to keep of it."""
    if cls not in _RULES:
        for f in fields(cls):
            if not isinstance(f.metadata.get("merge"), Merge):
                raise TypeError(f"{cls.__name__}.{f.name} declares no merge rule: give it metadata "
                                f"{{'merge': Merge...}}")
        ruled = [(f.name, f.metadata["merge"], f.metadata.get("then")) for f in fields(cls)]
        _RULES[cls] = MergeRules(tuple((name, then) for name, rule, then in ruled if rule is Merge.TOKENS),
                                 tuple(name for name, rule, _ in ruled if rule is Merge.FIRST),
                                 tuple(name for name, rule, _ in ruled if rule is Merge.LAST))
    return _RULES[cls]


def by_choice(outputs: list[RequestOutput]) -> list[RequestOutput]:
    """A whole request's outputs as one per answer, in choice order (a request with n > 1
    interleaves its answers' outputs)."""
    choices: dict[int, list[RequestOutput]] = {}
    for out in outputs:
        choices.setdefault(out.choice, []).append(out)
    return [RequestOutput.merge(choices[c]) for c in sorted(choices)]
