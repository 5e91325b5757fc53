"""Engine-side request state and the per-token output it produces. Only the scheduler
changes a request's `state`."""
import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Optional

from transformers import DynamicCache

from .detokenizer import IncrementalDetokenizer
from .params import FinishReason, SamplingParams
from .sampling import TokenChooser
from .stopping import StopSequenceFilter


class RequestState(enum.Enum):
    WAITING = "waiting"
    PREFILLING = "prefilling"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class TokenOutput:
    """One generated token, or the error that ended a request."""

    request_id: str
    token_id: int
    text: str
    logprob: float
    special: bool
    index: int
    finish_reason: Optional[FinishReason] = None
    error: Optional[str] = None
    prompt_tokens: int = 0
    generated_tokens: int = 0
    seed: Optional[int] = None

    @classmethod
    def failure(cls, request_id: str, message: str, index: int = 0, prompt_tokens: int = 0,
                generated_tokens: int = 0, seed: Optional[int] = None) -> "TokenOutput":
        """The output that ends a request with an error."""
        return cls(request_id, -1, "", 0.0, False, index, FinishReason.ERROR, error=message,
                   prompt_tokens=prompt_tokens, generated_tokens=generated_tokens, seed=seed)

    @property
    def ends(self) -> bool:
        """The request's last output: finished, or failed."""
        return self.finish_reason is not None or self.error is not None


@dataclass
class Request:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    seed: Optional[int]
    chooser: TokenChooser
    detokenizer: IncrementalDetokenizer
    stops: StopSequenceFilter
    sink: Callable[[TokenOutput], None]
    state: RequestState = RequestState.WAITING
    prefilled: int = 0  # prompt tokens already in `cache` (chunked prefill)
    cache: Optional[DynamicCache] = None  # own cache until it joins the batch
    generated: list[int] = field(default_factory=list)
    arrival: float = field(default_factory=time.perf_counter)  # for queue, TTFT and e2e times
    last_token_at: float = 0.0

    @property
    def reserved_tokens(self) -> int:
        """KV rows this request may come to hold: what admission reserves."""
        return len(self.prompt_ids) + self.params.max_tokens

    def history(self) -> list[int]:
        return self.prompt_ids + self.generated

    def emit_error(self, message: str) -> None:
        """The request's last output: the error that ended it (the scheduler released it)."""
        self.sink(TokenOutput.failure(self.request_id, message, len(self.generated), len(self.prompt_ids),
                                      len(self.generated), self.seed))
