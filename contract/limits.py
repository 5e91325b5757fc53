"""Request-size limits, declared once.

The gateway checks them while it parses a request, before anything is sent on; the engine
checks them again before any work (gRPC callers reach it without the gateway's checks). Both
read the same values, so a deployment overrides them with environment variables that every
process sees: LLM_MAX_BODY_BYTES, LLM_MAX_PROMPT_CHARS, LLM_MAX_MESSAGES,
LLM_MAX_STOP_SEQUENCES, LLM_MAX_STOP_CHARS, LLM_MAX_GRAMMAR_BYTES, LLM_MAX_GRAMMAR_COMPILE_MS.
The gateway's store of streams kept for a reconnect has its bounds here too (ResumeLimits).
Each bound's default, meaning and parsing are its variable's, declared in contract/settings.py.
"""
import random
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, Optional, TypeVar

from . import settings
from .errors import check

SEED_MAX = 2**64 - 1  # TGI's u64 range; torch.Generator.manual_seed takes all of it
MAX_TOP_LOGPROBS = 20  # alternatives per token a request may ask for (OpenAI's bound)
MAX_CHOICES = 16  # answers one request may ask for (n); each is a batch row, so the batch bounds it too
MAX_SPECULATIVE_TOKENS = 16  # prompt-lookup drafts per step
# OpenAI's reasoning_effort (Responses' reasoning.effort) as a reasoning_budget of thinking tokens; high: unbounded
REASONING_EFFORT_BUDGETS: dict[str, "int | None"] = {"none": 0, "minimal": 256, "low": 1024, "medium": 4096,
                                                     "high": None}


def draw_seed() -> int:
    """A seed for a sampled request that sent none, drawn where the request must be able to go on
    from its tokens (another replica, a reconnect); the engine reports it as one it drew."""
    return random.randint(0, SEED_MAX)


L = TypeVar("L", bound="EnvLimits")


def limit(name: str) -> int:
    """A bound's default: its variable's (LLM_<NAME>), declared in contract/settings.py."""
    return int(settings.default("LLM_" + name.upper()))


class EnvLimits:
    """Integer bounds, each overridden by LLM_<NAME> in the environment (contract/settings.py)."""

    @classmethod
    def from_env(cls: type[L], env: Optional[Mapping[str, str]] = None) -> L:
        return cls(**{f.name: settings.read("LLM_" + f.name.upper(), env)
                      for f in fields(cls)})  # type: ignore[arg-type]

    def as_dict(self) -> dict[str, int]:
        return asdict(self)  # type: ignore[call-overload]


@dataclass(frozen=True)
class ResumeLimits(EnvLimits):
    """Streams kept for a reconnect with Last-Event-ID (gateway/edge/resumable.py): how many, the
    bytes of their events in all, and the seconds one is kept after its reader left or it ended."""

    resume_streams: int = limit("resume_streams")
    resume_bytes: int = limit("resume_bytes")
    resume_seconds: int = limit("resume_seconds")


@dataclass(frozen=True)
class RequestLimits(EnvLimits):
    max_body_bytes: int = limit("max_body_bytes")
    max_prompt_chars: int = limit("max_prompt_chars")
    max_messages: int = limit("max_messages")
    max_stop_sequences: int = limit("max_stop_sequences")
    max_stop_chars: int = limit("max_stop_chars")
    max_grammar_bytes: int = limit("max_grammar_bytes")
    max_grammar_compile_ms: int = limit("max_grammar_compile_ms")

    def check_prompt(self, prompt: Any) -> None:
        """Before tokenizing: a prompt past the limit is refused without being read."""
        if isinstance(prompt, str):
            check(len(prompt) <= self.max_prompt_chars, "prompt",
                  f"{len(prompt)} characters; at most {self.max_prompt_chars}")

    def check_stop(self, stop: Any) -> None:
        if isinstance(stop, (list, tuple)):
            check(len(stop) <= self.max_stop_sequences, "stop",
                  f"at most {self.max_stop_sequences} stop sequences, got {len(stop)}")
            check(all(not isinstance(s, str) or len(s) <= self.max_stop_chars for s in stop), "stop",
                  f"a stop sequence may have at most {self.max_stop_chars} characters")

    def check_grammar(self, field_name: str, text: str) -> None:
        """Before compiling: a grammar past the limit is refused without being read."""
        size = len(text.encode("utf-8", "surrogatepass"))
        check(size <= self.max_grammar_bytes, field_name,
              f"{size} bytes; at most {self.max_grammar_bytes} (LLM_MAX_GRAMMAR_BYTES)")

    def check_messages(self, messages: Any) -> None:
        """Count and size before any rendering or tokenizing."""
        if not isinstance(messages, list):
            return
        check(len(messages) <= self.max_messages, "messages",
              f"at most {self.max_messages} messages, got {len(messages)}")
        chars = sum(len(str(m.get("content", ""))) for m in messages if isinstance(m, dict))
        check(chars <= self.max_prompt_chars, "messages",
              f"{chars} characters in all; at most {self.max_prompt_chars}")


DEFAULT_LIMITS = RequestLimits()  # without the environment: for direct use of the engine
