"""Request and engine parameters, validated before any work starts.

Errors name the offending field so every transport can report it as-is.
"""
import enum
import math
import random
from dataclasses import dataclass, field
from typing import Optional

from .errors import EngineDeadError, OverloadedError, ValidationError, check
from .limits import SEED_MAX, RequestLimits

__all__ = ["EngineConfig", "EngineDeadError", "FinishReason", "OverloadedError", "SamplingParams",
           "ValidationError"]


class FinishReason(str, enum.Enum):
    LENGTH = "length"
    EOS = "eos_token"
    STOP = "stop_sequence"
    ABORTED = "aborted"
    ERROR = "error"


@dataclass
class SamplingParams:
    max_tokens: int = 64
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    typical_p: float = 1.0
    repetition_penalty: float = 1.0
    seed: Optional[int] = None
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False

    def validate(self, max_tokens_limit: int, limits: RequestLimits = RequestLimits()) -> "SamplingParams":
        for name in ("max_tokens", "top_k"):
            check(_is_int(getattr(self, name)), name, "must be an integer")
        check(self.seed is None or _is_int(self.seed), "seed", "must be an integer or null")
        for name in ("temperature", "top_p", "typical_p", "repetition_penalty"):
            value = getattr(self, name)
            check(isinstance(value, (int, float)) and not isinstance(value, bool)
                   and math.isfinite(value), name, f"must be a finite number, got {value!r}")
            setattr(self, name, float(value))  # transformers' warpers insist on floats
        check(1 <= self.max_tokens <= max_tokens_limit, "max_tokens",
               f"must be between 1 and {max_tokens_limit}, got {self.max_tokens}")
        check(self.temperature >= 0, "temperature", f"must be >= 0, got {self.temperature}")
        check(self.top_k >= 0, "top_k", f"must be >= 0 (0 disables it), got {self.top_k}")
        check(0 < self.top_p <= 1, "top_p", f"must be in (0, 1], got {self.top_p}")
        check(0 < self.typical_p <= 1, "typical_p", f"must be in (0, 1], got {self.typical_p}")
        check(self.repetition_penalty > 0, "repetition_penalty",
               f"must be > 0, got {self.repetition_penalty}")
        check(self.seed is None or 0 <= self.seed <= SEED_MAX, "seed",
               f"must be between 0 and 2**64 - 1, got {self.seed}")
        limits.check_stop(self.stop)
        check(all(isinstance(s, str) and s for s in self.stop), "stop",
               "stop sequences must be non-empty strings")
        return self

    @property
    def greedy(self) -> bool:
        """Temperature 0 is the common API spelling of greedy decoding."""
        return not self.do_sample or self.temperature == 0

    def resolved_seed(self) -> Optional[int]:
        """Sampling without a seed still gets one, so it can be reported and replayed."""
        if self.greedy:
            return None
        return self.seed if self.seed is not None else random.getrandbits(64)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass
class EngineConfig:
    """What the service operator chooses; everything has a CPU-friendly default."""

    model: str
    device: Optional[str] = None  # None: cuda when available, else cpu
    dtype: str = "auto"  # auto: bf16 on GPU when supported, fp32 on CPU
    trust_remote_code: bool = False
    max_tokens_limit: int = 1024  # upper bound of a request's max_tokens
    max_running: int = 32  # requests decoded together in one batch
    max_waiting: int = 128  # requests queued behind them; beyond: overloaded
    max_batch_tokens: int = 32768  # KV budget: sum of prompt + max_tokens over running
    max_prefill_tokens: int = 512  # prompt tokens prefilled per step (chunked beyond)
    eos_token_ids: Optional[list[int]] = None  # None: from the model's generation config
    torch_threads: Optional[int] = None
    limits: RequestLimits = field(default_factory=RequestLimits.from_env)  # request sizes

    def validate(self) -> "EngineConfig":
        for name in ("max_tokens_limit", "max_running", "max_waiting",
                     "max_batch_tokens", "max_prefill_tokens"):
            if getattr(self, name) < 1:
                raise ValidationError(name, f"must be >= 1, got {getattr(self, name)}")
        return self
