"""Structured output: grammars compiled once, and each step's token masks (llguidance).

A constrained request carries a grammar matcher (TGI's token chooser with a grammar state).
Every step its disallowed tokens are masked before the token is chosen, greedy or sampled,
and the matcher then consumes the chosen token; when the grammar is complete the request
ends. vLLM's structured-output manager is the model: compile off the decode loop, cache by
the grammar's text, fill the batch's masks in parallel while the forward pass runs.
"""
import json
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Optional

import llguidance
import llguidance.hf
import torch
from llguidance import LLExecutor, LLMatcher, LLParserLimits

from contract import RequestLimits, SamplingParams, ValidationError

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
        return llguidance.hf.from_tokenizer(tokenizer), ""
    except Exception as exc:  # noqa: BLE001 - a tokenizer llguidance cannot read: refuse constraints
        return None, f"{type(exc).__name__}: {exc}"


class MaskFiller:
    """Each step's masks for the constrained rows: filled in llguidance's threads, on a
    thread of its own so that the forward pass runs meanwhile, then applied to the logits."""

    def __init__(self, grammars: GrammarCompiler):
        self.grammars = grammars  # its tokenizer's vocabulary sets the masks' width, once a row needs one
        self._executor = LLExecutor()
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llm-grammar-masks")
        self._bits = torch.arange(32, dtype=torch.int32)

    def start(self, rows: list[tuple[int, LLMatcher]]) -> Optional[Future]:
        """rows: (row in the logits, its matcher). None when no row is constrained."""
        if not rows:
            return None
        return self._thread.submit(self.fill, rows)

    def fill(self, rows: list[tuple[int, LLMatcher]]) -> tuple[list[int], torch.Tensor]:
        """(rows, their bitmasks [len(rows), words] int32: bit t of word w allows token 32w+t)."""
        tokenizer = self.grammars.tokenizer
        assert tokenizer is not None  # a constrained row's matcher was compiled with it
        words = (tokenizer.vocab_size + 31) // 32
        masks = torch.empty((len(rows), words), dtype=torch.int32)
        self._executor.unsafe_compute_mask_ptr([(m, i) for i, (_, m) in enumerate(rows)], masks.data_ptr(),
                                               words * 4, len(rows))
        return [row for row, _ in rows], masks

    @torch.inference_mode()
    def apply(self, filled: tuple[list[int], torch.Tensor], logits: torch.Tensor) -> None:
        """Disallowed tokens of each masked row to -inf, in place. logits: [rows, vocab]."""
        rows, masks = filled
        allowed = ((masks.unsqueeze(-1) >> self._bits) & 1).bool().view(len(rows), -1)
        vocab = logits.shape[-1]
        if allowed.shape[1] < vocab:  # ids past the tokenizer's vocabulary: never allowed
            allowed = torch.cat([allowed, allowed.new_zeros((len(rows), vocab - allowed.shape[1]))], 1)
        index = torch.tensor(rows, dtype=torch.long, device=logits.device)
        logits[index] = logits[index].masked_fill(~allowed[:, :vocab].to(logits.device), float("-inf"))

    def shutdown(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)


def grammar_complete(matcher: LLMatcher, token: int) -> bool:
    """Advance the grammar by the chosen token (appended already: the matcher may stop right
    after the closing brace); whether it is complete. A token it refused fails the request."""
    if not matcher.consume_token(token) or matcher.is_error():
        raise RuntimeError(f"structured output: the grammar refused token {token}: "
                           f"{_first_lines(matcher.get_error())}")
    return matcher.is_stopped()
