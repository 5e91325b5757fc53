"""Engine-side request state. Only the scheduler changes a request's `state`."""
import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Optional

from contract import SamplingParams

from ..outputs import RequestOutput
from ..policies.detokenizer import IncrementalDetokenizer
from ..policies.prompt_logprobs import PromptScores
from ..policies.sampling import TokenChooser
from ..policies.speculation import PromptLookup
from ..policies.stopping import StopSequenceFilter
from ..policies.tools import ToolCallParser


class RequestState(enum.Enum):
    WAITING = "waiting"
    PREFILLING = "prefilling"
    RUNNING = "running"  # holds blocks: computing its prompt, or decoding
    PREEMPTED = "preempted"  # gave its blocks back; waits to compute its history again
    FINISHED = "finished"


@dataclass(eq=False)  # a row is itself: compared by identity
class Request:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    seed: Optional[int]
    chooser: TokenChooser
    detokenizer: IncrementalDetokenizer
    stops: StopSequenceFilter
    sink: Callable[[RequestOutput], None]
    state: RequestState = RequestState.WAITING
    computed: int = 0  # tokens of its history whose keys and values are in its blocks
    block_keys: list[int] = field(default_factory=list)  # prefix-cache keys of its history's full blocks
    generated: list[int] = field(default_factory=list)
    arrival: float = field(default_factory=time.perf_counter)  # for queue, TTFT and e2e times
    last_token_at: float = 0.0
    matcher: Any = None  # structured output: the grammar's state (llguidance.LLMatcher)
    tool_parser: Optional[ToolCallParser] = None  # tool calls: reads them off the text
    choice: int = 0  # which of the request's n answers this is (each is a batch row)
    rows: int = 1  # batch rows it stands for: n until its prompt is prefilled and shared
    prompt_scores: Optional[PromptScores] = None  # prompt_logprobs: filled while prefilling
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache
    drafter: Optional[PromptLookup] = None  # speculative decoding: drafts its next tokens
    speculative: int = 0  # drafts per decode step (0: none)

    @property
    def row_id(self) -> str:
        """Its key in the running batch: one per answer."""
        return self.request_id if self.choice == 0 else f"{self.request_id}#{self.choice}"

    @property
    def row_tokens(self) -> int:
        """KV length one of its rows may come to hold."""
        return len(self.prompt_ids) + self.params.max_tokens

    def history(self) -> list[int]:
        return self.prompt_ids + self.generated

    @property
    def length(self) -> int:
        """Tokens in its history (without building it: the step loop asks often)."""
        return len(self.prompt_ids) + len(self.generated)

    @property
    def todo(self) -> int:
        """Tokens of its history whose keys and values are not computed yet."""
        return len(self.prompt_ids) + len(self.generated) - self.computed

    def tokens(self, start: int, end: int) -> list[int]:
        """history()[start:end], without building the whole history."""
        prompt = len(self.prompt_ids)
        if end <= prompt:
            return self.prompt_ids[start:end]
        if start >= prompt:
            return self.generated[start - prompt:end - prompt]
        return self.prompt_ids[start:] + self.generated[:end - prompt]

    def emit_error(self, message: str) -> None:
        """The request's last output: the error that ended it (the scheduler released it)."""
        self.sink(RequestOutput.failure(self.request_id, message, len(self.generated), len(self.prompt_ids),
                                      len(self.generated), self.seed, self.choice))
