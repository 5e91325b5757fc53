"""Structured output: grammars compiled once, and each step's token masks (llguidance).

A constrained request carries a grammar matcher (TGI's token chooser with a grammar state).
Every step its disallowed tokens are masked before the token is chosen, greedy or sampled,
and the matcher then consumes the chosen token; when the grammar is complete the request
ends. vLLM's structured-output manager is the model: compile off the decode loop, cache by
the grammar's text, fill the batch's masks in parallel while the forward pass runs (masks.py).
The frontend compiles grammars where requests arrive, so this module does without torch.
"""
import json
import threading
from collections import OrderedDict
from typing import Any, Optional

import llguidance
import llguidance.hf
from llguidance import LLMatcher, LLParserLimits

from contract import RequestLimits, SamplingParams, ValidationError

from ..model.decoding_tokenizer import with_merges
from .tools import ToolSpec

# llguidance's input format for each structured-output request field
FORMATS = {"json_schema": "json_schema", "json_object": "json_schema", "regex": "regex", "choice": "choice",
           "grammar": "grammar"}  # tools: a Lark grammar of their calls (tools.py)
CACHED_GRAMMARS = 256  # compiled grammars kept, least recently used out first
LEXER_FUEL_PER_MS = 50_000  # llguidance's own estimate of its compile speed
JSON_DEFAULTS = {"whitespace_flexible": False}  # compact JSON: fewer tokens, no runaway whitespace


class GrammarCompiler:
    """Grammar text -> a fresh matcher, for one tokenizer; thread-safe, cached by text."""

    def __init__(self, tokenizer: Any, limits: RequestLimits):
        self.limits = limits
        self.parser_limits = LLParserLimits(initial_lexer_fuel=limits.max_grammar_compile_ms * LEXER_FUEL_PER_MS)
        self._cache: OrderedDict[tuple[str, str], LLMatcher] = OrderedDict()
        self._lock = threading.Lock()
        # llguidance's view of the vocabulary takes seconds of Python to build for a large one (6 s
        # for Gemma 3's 262k tokens on 2 cores) and only constrained requests need it: built by the
        # first (off the decode loop, where grammars compile), not on the start-up path, where a
        # thread of its own would only take the interpreter from the start's other work
        self._source = tokenizer
        self._built: Optional[tuple[Optional[llguidance.LLTokenizer], str]] = None
        self._build_lock = threading.Lock()

    @property
    def tokenizer(self) -> Optional[llguidance.LLTokenizer]:
        """llguidance's tokenizer (built at the first call), or None where it cannot read this one."""
        return self._llguidance()[0]

    @property
    def unavailable(self) -> str:
        """Why there is no llguidance tokenizer ("" where there is one)."""
        return self._llguidance()[1]

    def _llguidance(self) -> tuple[Optional[llguidance.LLTokenizer], str]:
        with self._build_lock:
            if self._built is None:
                self._built = _llguidance_tokenizer(self._source)
            return self._built

    def matcher(self, params: SamplingParams) -> Optional[LLMatcher]:
        """The request's own matcher, or None when it sets no constraint; raises
        ValidationError naming the field, with llguidance's reason."""
        constraint = params.constraint()
        if constraint is None:
            return None
        field, text = constraint
        if self.tokenizer is None:
            raise ValidationError(field, f"structured output is not available for this model's tokenizer "
                                         f"({self.unavailable})")
        with self._lock:
            template = self._cache.get((field, text))
            if template is not None:
                self._cache.move_to_end((field, text))
        if template is None:
            template = self._compile(field, text)
            with self._lock:
                self._cache[(field, text)] = template
                while len(self._cache) > CACHED_GRAMMARS:
                    self._cache.popitem(last=False)
        return template.deep_copy()

    def cached(self, params: SamplingParams) -> bool:
        constraint = params.constraint()
        with self._lock:
            return constraint is None or constraint in self._cache

    def _compile(self, field: str, text: str) -> LLMatcher:
        try:
            if field == "json_schema" or field == "json_object":
                grammar = LLMatcher.grammar_from_json_schema(text, defaults=JSON_DEFAULTS)  # type: ignore[arg-type]
            elif field == "tools":
                spec = ToolSpec.parse(**json.loads(text))
                grammar = LLMatcher.grammar_from_lark(spec.grammar()) if spec else ""
            else:
                grammar = llguidance.grammar_from(FORMATS[field], text)  # type: ignore[arg-type]
        except (ValueError, TypeError) as exc:
            raise ValidationError(field, f"does not compile: {exc}") from None
        matcher = LLMatcher(self.tokenizer, grammar, log_level=0, limits=self.parser_limits)  # type: ignore[arg-type]
        if matcher.is_error():
            raise ValidationError(field, f"does not compile: {_first_lines(matcher.get_error())}")
        return matcher


def _first_lines(message: str, lines: int = 4) -> str:
    return " ".join(line.strip() for line in message.strip().splitlines()[:lines])


def _llguidance_tokenizer(tokenizer: Any) -> tuple[Optional[llguidance.LLTokenizer], str]:
    try:
        return llguidance.hf.from_tokenizer(with_merges(tokenizer)), ""
    except Exception as exc:  # noqa: BLE001 - a tokenizer llguidance cannot read: refuse constraints
        return None, f"{type(exc).__name__}: {exc}"


def grammar_complete(matcher: LLMatcher, token: int) -> bool:
    """Advance the grammar by the chosen token (appended already: the matcher may stop right
    after the closing brace); whether it is complete. A token it refused fails the request."""
    if not matcher.consume_token(token) or matcher.is_error():
        raise RuntimeError(f"structured output: the grammar refused token {token}: "
                           f"{_first_lines(matcher.get_error())}")
    return matcher.is_stopped()
