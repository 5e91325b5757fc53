"""Engine-side request state: a row (one answer) and the parent of a request's n answers.

A row's state (ROW_STATE: where it is, how much of its history is computed, what it generated,
what the cache gave it) is written by the scheduler alone (scheduler.py: `schedule`, `update`,
the aborts and the failures); everything else reads it. Its policies (chooser, output pipeline,
drafter) keep their own state, which only they change.
"""
import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Optional

from contract import SamplingParams

from ..outputs import PromptScores, RequestOutput
from ..policies.output import OutputPipeline
from ..policies.sampling import TokenChooser
from ..policies.speculation import Acceptance, PromptLookup

ROW_STATE = ("state", "computed", "generated", "cached_tokens")  # the scheduler's to write (a test checks)


class RequestState(enum.Enum):
    WAITING = "waiting"
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
    pipeline: OutputPipeline
    sink: Callable[[RequestOutput], None]
    choice: int = 0  # which of the request's n answers this is (each is a batch row)
    adapter: Optional[str] = None  # the LoRA adapter it is answered with (EngineConfig.lora's name; None: the base)
    drafter: Optional[PromptLookup] = None  # speculative decoding: drafts its next tokens
    speculative: int = 0  # drafts per decode step (0: none)
    adaptive: bool = False  # drafts only as many as pay (the server's default; a request's own number is kept)
    acceptance: Acceptance = field(default_factory=Acceptance)  # its drafts so far
    prompt_scores: Optional[PromptScores] = None  # prompt_logprobs: filled while prefilling
    parent: Optional["ParentRequest"] = None  # n > 1: the answers still to fan out from this row
    arrival: float = field(default_factory=time.perf_counter)  # for queue, TTFT and e2e times
    last_token_at: float = 0.0
    # ----- ROW_STATE: the scheduler's -----
    state: RequestState = RequestState.WAITING
    computed: int = 0  # tokens of its history whose keys and values are in its blocks
    generated: list[int] = field(default_factory=list)  # a resumed request starts with the tokens it had
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache

    @property
    def row_id(self) -> str:
        """Its key in the running batch: one per answer."""
        return self.request_id if self.choice == 0 else f"{self.request_id}#{self.choice}"

    @property
    def rows(self) -> int:
        """Batch rows it stands for: itself, and the answers that fan out of it."""
        return 1 + (len(self.parent.children) if self.parent is not None else 0)

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

    @property
    def fans_out(self) -> bool:
        """Its answers are still to fan out (they do once its prompt is computed)."""
        return self.parent is not None and bool(self.parent.children)


@dataclass(eq=False)
class ParentRequest:
    """A request with n answers (vLLM's ParentRequest): its first answer's row computes the
    prompt once; then the other answers, made at admission with seeds one apart, fork its blocks
    and choose their first tokens from the same logits. Their blocks for the fork are reserved
    when the first row starts, so no row is ever preempted for them in the middle of a step."""

    children: list[Request]
    reserved: list[int] = field(default_factory=list)  # blocks held for the children's last prompt blocks
