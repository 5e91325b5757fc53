"""A request's validation, chat rendering and tokenization: the work before it can queue.

It needs the tokenizer and the limits, not the model, so it runs wherever requests arrive
(the engine's preparation thread), and only token ids travel to the decode loop, which may
be another process.
"""
from collections.abc import Sequence
from typing import Any, Optional

from transformers import PreTrainedTokenizerBase

from contract import EngineConfig, SamplingParams, ValidationError, check

from ..messages import Prepared
from ..policies.structured import GrammarCompiler
from ..policies.tools import ToolSpec, tool_spec
from .chat import render_chat_ids, turn_markers


class Preparer:
    def __init__(self, tokenizer: PreTrainedTokenizerBase, config: EngineConfig, max_context: int,
                 grammars: Optional[GrammarCompiler] = None):
        self.tokenizer = tokenizer
        self.config = config
        self.max_context = max_context
        self.grammars = grammars  # the decode loop's own, where it runs in this process

    def prepare(self, prompt: Any, params: SamplingParams, messages: Any = None) -> Prepared:
        """Validate, render chat messages (when given, they replace `prompt`) and tokenize, once
        each and cheapest first; raises ValidationError naming the field before any work. Where
        the decode loop runs in this process, its grammar compiles here, off the event loop, into
        the loop's cache; an engine process compiles its own (and refuses before any token).
        A resumed answer (`resume_tokens`) goes on from the tokens it had. Chat messages in the
        plain format end at its next turn marker (chat.py's `turn_markers`)."""
        params.validate(self.config.max_tokens_limit, self.config.limits)
        spec = tool_spec(params)
        ids = self._chat_ids(messages, params, spec) if messages else self._prompt_ids(prompt)
        self._check_length(len(ids), params.max_tokens)  # the batch budget: Scheduler.submit
        generated = self._resumed(params.resume_tokens, params)
        if self.grammars is not None:
            self.grammars.matcher(params)
        markers = turn_markers(self.tokenizer) if messages else ()
        return Prepared(ids, params, params.resolved_seed(), generated, markers)

    def _resumed(self, resume: Sequence[int], params: SamplingParams) -> list[int]:
        tokens = list(resume or [])
        if not tokens:
            return tokens
        vocab = len(self.tokenizer)
        check(all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in tokens),
              "resume_tokens", f"must be token ids from 0 to {vocab - 1}")
        check(len(tokens) < params.max_tokens, "resume_tokens",
              f"{len(tokens)} tokens leave nothing to generate within max_tokens ({params.max_tokens})")
        check(params.seed is not None or params.greedy, "resume_tokens",
              "a sampled answer goes on from its tokens only with the seed it was sampled with")
        return tokens

    def _prompt_ids(self, prompt: Any) -> list[int]:
        """A prompt's token ids: as given (a list of ids, the model's own), or its text's."""
        if isinstance(prompt, list):
            vocab = len(self.tokenizer)
            check(bool(prompt) and all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab
                                       for t in prompt), "prompt_token_ids",
                  f"must be a non-empty list of token ids from 0 to {vocab - 1}")
            return list(prompt)
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValidationError("prompt", "must be a non-empty string")
        self.config.limits.check_prompt(prompt)  # never tokenize 20 MB to find it is too long
        return self.tokenizer(prompt)["input_ids"]

    def tokenize(self, prompt: Any, params: SamplingParams, messages: Any = None) -> list[int]:
        """The prompt's token ids as a request would have them (chat rendered with its template and
        tools), validated as `prepare` validates them: /tokenize, Anthropic's count_tokens."""
        params.validate(self.config.max_tokens_limit, self.config.limits)
        return self._chat_ids(messages, params, tool_spec(params)) if messages else self._prompt_ids(prompt)

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
