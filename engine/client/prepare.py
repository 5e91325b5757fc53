"""A request's validation, chat rendering and tokenization: the work before it can queue.

It needs the tokenizer and the limits, not the model, so it runs wherever requests arrive
(the engine's preparation thread), and only token ids travel to the decode loop, which may
be another process.
"""
from dataclasses import dataclass
from typing import Any, Optional

from transformers import PreTrainedTokenizerBase

from contract import EngineConfig, SamplingParams, ValidationError

from ..policies.structured import GrammarCompiler
from ..policies.tools import ToolSpec, tool_spec
from .chat import render_chat_ids


@dataclass
class Prepared:
    """What the decode loop needs to run a request; plain data, so it pickles (the matcher
    stays behind: the engine process compiles the grammar again, from its own cache)."""

    prompt_ids: list[int]
    params: SamplingParams
    seed: Optional[int]  # drawn here when sampling without one, so that it is reported
    matcher: Any = None  # a structured-output request's grammar matcher (llguidance.LLMatcher)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "matcher": None}


class Preparer:
    def __init__(self, tokenizer: PreTrainedTokenizerBase, config: EngineConfig, max_context: int,
                 grammars: Optional[GrammarCompiler] = None):
        self.tokenizer = tokenizer
        self.config = config
        self.max_context = max_context
        self.grammars = grammars or GrammarCompiler(tokenizer, config.limits)

    def prepare(self, prompt: Any, params: SamplingParams, messages: Any = None) -> Prepared:
        """Validate, render chat messages (when given, they replace `prompt`), tokenize and
        compile the grammar, once each and cheapest first; raises ValidationError naming the
        field before any work."""
        params.validate(self.config.max_tokens_limit, self.config.limits)
        spec = tool_spec(params)
        ids = self._chat_ids(messages, params, spec) if messages else self._prompt_ids(prompt)
        self._check_length(len(ids), params.max_tokens)  # the batch budget: Scheduler.submit
        return Prepared(ids, params, params.resolved_seed(), self.grammars.matcher(params))

    def _prompt_ids(self, prompt: Any) -> list[int]:
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValidationError("prompt", "must be a non-empty string")
        self.config.limits.check_prompt(prompt)  # never tokenize 20 MB to find it is too long
        return self.tokenizer(prompt)["input_ids"]

    def _chat_ids(self, messages: Any, params: SamplingParams, spec: Optional[ToolSpec]) -> list[int]:
        room = self.max_context - params.max_tokens
        if room < 1:
            raise ValidationError("max_tokens", f"leaves no room for the messages in the model's "
                                                f"context of {self.max_context} tokens")
        _, ids, _ = render_chat_ids(self.tokenizer, messages, room, self.config.limits, spec)
        return ids

    def _check_length(self, prompt_tokens: int, max_tokens: int) -> None:
        context = self.max_context
        if prompt_tokens == 0:
            raise ValidationError("prompt", "tokenizes to no tokens")
        if prompt_tokens >= context:
            raise ValidationError("prompt", f"{prompt_tokens} tokens does not fit the model's "
                                            f"context of {context} tokens")
        if prompt_tokens + max_tokens > context:
            raise ValidationError("max_tokens", (
                f"prompt ({prompt_tokens} tokens) + max_tokens ({max_tokens}) exceeds the "
                f"model's context of {context} tokens; lower max_tokens to at most "
                f"{context - prompt_tokens}"))
