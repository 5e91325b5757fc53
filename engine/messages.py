"""The typed messages between the executor's process and the engine process, and the
observer's events, which cross the same pipe (vLLM's EngineCoreRequest / EngineCoreOutputs).

Commands go one way (`Command`), replies the other (`Reply`); both ends dispatch with
`match`, so a new message is a new dataclass, and mypy checks both ends.
"""
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from contract import EngineConfig, FinishReason, SamplingParams

from .observer import EngineObserver
from .outputs import RequestOutput


# ----- executor -> engine process -----
@dataclass
class LoadModel:
    """The first command: the model to load. `tokenizer_from`: the folder where the model's
    tokenizer is kept from an earlier load (gguf_file.kept_tokenizer), which the executor's side
    builds itself while the engine process imports and loads: the engine process then answers
    TokenizerKept instead of pickling its own."""

    config: EngineConfig
    tokenizer_from: Optional[str] = None


@dataclass
class Prepared:
    """What the decode loop needs to run a request (prepare.py makes it); plain data, so it
    pickles. The grammar is compiled where the decode loop runs."""

    prompt_ids: list[int]
    params: SamplingParams
    seed: Optional[int]  # drawn when sampling without one, so that it is reported
    generated: list[int] = field(default_factory=list)  # a resumed request's tokens so far
    turn_markers: tuple[str, ...] = ()  # stop sequences of the chat format besides params.stop (chat.py)


@dataclass
class AddRequest:
    request_id: str
    prepared: Prepared


@dataclass
class AbortRequest:
    request_id: str


@dataclass
class Shutdown:
    """Fail what is in flight and exit."""


Command = Union[LoadModel, AddRequest, AbortRequest, Shutdown]  # LoadModel comes first, once


# ----- observer events (metrics), recorded in the engine process and replayed -----
@dataclass
class Admitted:
    queued_seconds: float


@dataclass
class Prefilled:
    prompt_tokens: int
    cached_tokens: Optional[int]  # None: no prefix cache looked at


@dataclass
class Preempted:
    pass


@dataclass
class Speculated:
    drafted: int
    accepted: int


@dataclass
class TokenTimed:
    first: bool
    since_previous_seconds: float


@dataclass
class Finished:
    reason: Optional[FinishReason]
    e2e_seconds: float


ObserverEvent = Union[Admitted, Prefilled, Preempted, Speculated, TokenTimed, Finished]


def replay(event: ObserverEvent, observer: EngineObserver) -> None:
    match event:
        case Admitted(queued):
            observer.admitted(queued)
        case Prefilled(tokens, cached):
            observer.prefilled(tokens, cached)
        case Preempted():
            observer.preempted()
        case Speculated(drafted, accepted):
            observer.speculated(drafted, accepted)
        case TokenTimed(first, since):
            observer.token(first, since)
        case Finished(reason, e2e):
            observer.finished(reason, e2e)


class Recorder(EngineObserver):
    """Keeps the engine's observer calls as events, for the executor's observer (metrics)."""

    def __init__(self) -> None:
        self.events: list[ObserverEvent] = []

    def admitted(self, queued_seconds: float) -> None:
        self.events.append(Admitted(queued_seconds))

    def prefilled(self, prompt_tokens: int, cached_tokens: Optional[int] = None) -> None:
        self.events.append(Prefilled(prompt_tokens, cached_tokens))

    def preempted(self) -> None:
        self.events.append(Preempted())

    def speculated(self, drafted: int, accepted: int) -> None:
        self.events.append(Speculated(drafted, accepted))

    def token(self, first: bool, since_previous_seconds: float) -> None:
        self.events.append(TokenTimed(first, since_previous_seconds))

    def finished(self, reason: Optional[FinishReason], e2e_seconds: float) -> None:
        self.events.append(Finished(reason, e2e_seconds))


# ----- engine process -> executor -----
@dataclass
class TokenizerLoaded:
    """The model's tokenizer, sent as soon as the load has it, before the weights: the executor's
    side unpickles it (a second for Gemma 3's 262,144 tokens) while the weights load."""

    tokenizer: Any  # a transformers tokenizer


@dataclass
class TokenizerKept:
    """In place of TokenizerLoaded: the load's tokenizer is the one kept in LoadModel's
    `tokenizer_from`, the same object the executor's side builds from there."""


@dataclass
class Ready:
    """The model loaded: what the executor's side needs to prepare requests."""

    info: Any  # loader.ModelInfo
    tokenizer: Any  # a transformers tokenizer; None when a TokenizerLoaded or TokenizerKept came before
    stats: dict
    stages: dict = field(default_factory=dict)  # time.monotonic() at each stage of its start (core_process.py)


@dataclass
class LoadFailed:
    message: str


@dataclass
class Claimed:
    """An engine process started ahead (core/ahead_process.py) is now the connecting executor's:
    its pid, and when it started (time.monotonic(), which every process of the machine shares)."""

    pid: int
    started_at: float


@dataclass
class Ack:
    """A request was queued (error None) or refused before any token."""

    request_id: str
    error: Optional[BaseException] = None


@dataclass
class StepOutputs:
    """One message per engine step, for every request: what changed since the last."""

    acks: list[Ack] = field(default_factory=list)
    outputs: list[RequestOutput] = field(default_factory=list)
    events: list[ObserverEvent] = field(default_factory=list)
    stats: dict = field(default_factory=dict)


Reply = Union[TokenizerLoaded, TokenizerKept, Ready, LoadFailed, StepOutputs]
