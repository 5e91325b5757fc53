"""The engine's one output record: what a request produced since its previous record.

Per-token fields are always lists, so one shape covers one token (the decode loop emits
one per step), a chunk a slow reader takes at once (`merge`), a whole answer (`complete`)
and the error that ends a request (no tokens, `error` set).
"""
from dataclasses import dataclass, field
from typing import Optional

from contract import ErrorKind, FinishReason, GenerationError, RequestFailedError, ValidationError, kind_of

from .policies.prompt_logprobs import PromptScores
from .policies.tools import ToolCallDelta, merged


@dataclass
class RequestOutput:
    request_id: str
    token_ids: list[int] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)  # each token's new text (may be "": held back)
    logprobs: list[float] = field(default_factory=list)
    special: list[bool] = field(default_factory=list)
    index: int = -1  # position of the last token in the generation
    finish_reason: Optional[FinishReason] = None
    error: Optional[str] = None
    error_kind: Optional[ErrorKind] = None  # what failed: this request alone (unprocessable, validation) or more
    error_field: Optional[str] = None  # the field to blame, where one is
    prompt_tokens: int = 0
    generated_tokens: int = 0
    seed: Optional[int] = None
    tool_calls: list[ToolCallDelta] = field(default_factory=list)  # parts of calls, in order
    # top_logprobs: each token's likeliest alternatives, (id, its text alone, log probability)
    alternatives: list[list[tuple[int, str, float]]] = field(default_factory=list)
    token_strs: list[str] = field(default_factory=list)  # top_logprobs: each token's text alone
    choice: int = 0  # which of the request's n answers
    prompt: Optional[PromptScores] = None  # prompt_logprobs: on each answer's first output
    cached_tokens: int = 0  # prompt tokens served from the prefix cache
    stop_sequence: Optional[str] = None  # the stop sequence that ended the answer (finish_reason stop_sequence)
    thoughts: list[str] = field(default_factory=list)  # each token's new reasoning text (policies/reasoning.py)
    reasoning_tokens: int = 0  # of generated_tokens, those of the thinking (its markers too)

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
        """Consecutive outputs of one answer as one: the lists joined, the rest the last's."""
        last = outputs[-1]
        whole = cls(last.request_id, [], [], [], [], last.index, last.finish_reason, last.error, last.error_kind,
                    last.error_field, last.prompt_tokens, last.generated_tokens, last.seed, choice=last.choice,
                    cached_tokens=last.cached_tokens, stop_sequence=last.stop_sequence,
                    reasoning_tokens=last.reasoning_tokens,
                    prompt=next((o.prompt for o in outputs if o.prompt is not None), None))
        for out in outputs:
            whole.token_ids += out.token_ids
            whole.texts += out.texts
            whole.logprobs += out.logprobs
            whole.special += out.special
            whole.tool_calls += out.tool_calls
            whole.alternatives += out.alternatives
            whole.token_strs += out.token_strs
            whole.thoughts += out.thoughts
        whole.tool_calls = merged(whole.tool_calls)
        return whole


def by_choice(outputs: list[RequestOutput]) -> list[RequestOutput]:
    """A whole request's outputs as one per answer, in choice order (a request with n > 1
    interleaves its answers' outputs)."""
    choices: dict[int, list[RequestOutput]] = {}
    for out in outputs:
        choices.setdefault(out.choice, []).append(out)
    return [RequestOutput.merge(choices[c]) for c in sorted(choices)]
