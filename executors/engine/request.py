"""Engine-side request state and the per-token output it produces."""
import enum
from dataclasses import dataclass, field
from typing import Callable, Optional

from transformers import DynamicCache

from .detokenizer import IncrementalDetokenizer, StopSequenceFilter
from .params import FinishReason, SamplingParams
from .sampling import TokenChooser


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

    @property
    def reserved_tokens(self) -> int:
        """KV rows this request may come to hold: what admission reserves."""
        return len(self.prompt_ids) + self.params.max_tokens

    def history(self) -> list[int]:
        return self.prompt_ids + self.generated

    def fail(self, message: str) -> None:
        self.state = RequestState.FINISHED
        self.cache = None
        self.sink(TokenOutput(self.request_id, -1, "", 0.0, False, len(self.generated),
                              FinishReason.ERROR, error=message,
                              prompt_tokens=len(self.prompt_ids),
                              generated_tokens=len(self.generated), seed=self.seed))
