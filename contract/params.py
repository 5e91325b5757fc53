"""Request options (SamplingParams) and the operator's engine options (EngineConfig),
validated before any work starts.

Errors name the offending field so every transport can report it as-is.
"""
import enum
import json
import math
import operator
import random
import typing
from collections.abc import Callable, Mapping
from dataclasses import Field, dataclass, field, fields
from typing import Any, Optional

from . import settings
from .errors import EngineDeadError, OverloadedError, ValidationError, check
from .keep_alive import keep_alive_seconds
from .limits import DEFAULT_LIMITS, MAX_CHOICES, MAX_SPECULATIVE_TOKENS, MAX_TOP_LOGPROBS, SEED_MAX, RequestLimits

__all__ = ["EngineConfig", "EngineDeadError", "FinishReason", "OverloadedError", "SamplingParams",
           "ValidationError", "field_type", "item_type", "request_fields"]


class FinishReason(enum.StrEnum):
    LENGTH = "length"
    EOS = "eos_token"
    STOP = "stop_sequence"
    ABORTED = "aborted"
    ERROR = "error"
    TOOL_CALLS = "tool_calls"  # the answer ends in tool calls


def request_field(default: Any, help: str, **rules: Any) -> Any:
    """A request option. PromptDocument, the protocols (under their own names where they
    have one), the WebSocket chat and the CLI all derive from these declarations. `rules`:
    bounds (ge, gt, le, lt) that `validate` checks and the schema reads (`le`, for the wire
    type), and `warper` for sampling-only options."""
    metadata = {"help": help, **rules}
    if isinstance(default, list):
        return field(default_factory=list, metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass
class SamplingParams:
    """A request's options, declared once (see `request_field`)."""

    model: Optional[str] = request_field(
        None, "the served model that answers: an id that /v1/models lists (null: the first one); any other "
              "name is refused with 404, naming the served ones")
    keep_alive: Optional[float] = request_field(
        None, "seconds the model stays loaded after this request ends (negative: for good; 0: it unloads "
              "then); null: the server's LLM_KEEP_ALIVE")
    max_tokens: int = request_field(
        64, "tokens to generate: 1 to the server's max_tokens_limit; 0 scores the prompt without generating "
            "(with prompt_logprobs)", ge=0)
    n: int = request_field(1, f"choices: independent answers to one prompt, prefilled once and decoded together "
                              f"(1 to {MAX_CHOICES}; each takes a batch row)", ge=1, le=MAX_CHOICES)
    do_sample: bool = request_field(False, "sample; false decodes greedily (so does temperature 0)")
    # warper=True: a sampling-only option (TGI samples when one is moved off its default)
    temperature: float = request_field(1.0, "sampling temperature", ge=0, warper=True)
    top_k: int = request_field(0, "sample among the k likeliest tokens (0: all)", ge=0, warper=True)
    top_p: float = request_field(1.0, "sample within this probability mass (nucleus)", gt=0, le=1, warper=True)
    typical_p: float = request_field(1.0, "typical sampling's probability mass", gt=0, le=1, warper=True)
    min_p: float = request_field(
        0.0, "drop tokens less likely than min_p x the likeliest one (0: off)", ge=0, le=1, warper=True)
    repetition_penalty: float = request_field(
        1.0, "divides the scores of tokens already in the prompt or output; greedy too", gt=0)
    presence_penalty: float = request_field(
        0.0, "OpenAI's: subtracted from the scores of tokens already generated; greedy too", ge=-2, le=2)
    frequency_penalty: float = request_field(
        0.0, "OpenAI's: subtracted once per time a token was generated; greedy too", ge=-2, le=2)
    seed: Optional[int] = request_field(
        None, "sampling seed, 0 to 2**64 - 1; when absent one is drawn and reported", ge=0, le=SEED_MAX)
    stop: list[str] = request_field(
        [], "stop sequences: the text ends before the first one, which is never streamed")
    stream_interval: Optional[int] = request_field(
        None, "tokens per streamed document, at least (the last may have fewer); null: the server's", ge=1)
    ignore_eos: bool = request_field(False, "go on past the end-of-sequence token, to max_tokens (benchmarks)")
    logprobs: bool = request_field(False, "report each generated token's own text with its log probability "
                                          "(OpenAI's logprobs); the log probabilities come always")
    top_logprobs: int = request_field(
        0, "the likeliest alternatives reported with each generated token, with their log probabilities "
           "(the model's own distribution)", ge=0, le=MAX_TOP_LOGPROBS)
    speculative_tokens: Optional[int] = request_field(
        None, "prompt-lookup speculative decoding: tokens drafted per step from the prompt and answer so far, "
              "verified in one forward pass (0: off; null: the server's speculative_tokens when greedy, each step "
              "checking only as many drafts as pay on this machine, off when sampling; a number: that many, as "
              "asked). It never changes the answer, only how fast it comes", ge=0, le=MAX_SPECULATIVE_TOKENS)
    prompt_logprobs: bool = request_field(
        False, "report each prompt token's log probability given the tokens before it (the first has none), "
               "with top_logprobs alternatives: scoring a text")
    # structured output, enforced while decoding; at most one of them (constraint=True)
    json_schema: Optional[str] = request_field(
        None, "structured output: JSON valid against this JSON schema (JSON text)", constraint=True, cli_file=True)
    json_object: bool = request_field(False, "structured output: any JSON object", constraint=True)
    regex: Optional[str] = request_field(
        None, "structured output: text matching this regular expression (Rust regex syntax)", constraint=True)
    choice: list[str] = request_field([], "structured output: exactly one of these strings", constraint=True)
    grammar: Optional[str] = request_field(
        None, "structured output: text in this grammar (Lark, as llguidance reads it, or GBNF)", constraint=True)
    # tool calls: OpenAI's tools (a JSON list), enforced by a grammar of their calls
    tools: Optional[str] = request_field(
        None, "tool calls: OpenAI's tools, as a JSON list of {type: function, function: {name, description, "
              "parameters}}", constraint=True, cli_file=True)
    tool_choice: Optional[str] = request_field(
        None, "none, auto (the default with tools), required, or the name of the function to call")
    parallel_tool_calls: bool = request_field(True, "whether an answer may make several calls")
    reasoning_budget: Optional[int] = request_field(
        None, "reasoning models: thinking tokens at most, after which the close marker is forced and the answer "
              "follows (0: no thinking; null: as the model goes)", ge=0)
    resume_tokens: list[int] = request_field(
        [], "an answer's tokens so far (ids): it goes on from them as if it had never stopped, token for token, "
            "with the seed it was sampled with (the gateway moves a stream off a lost replica this way)")

    def validate(self, max_tokens_limit: int, limits: RequestLimits = DEFAULT_LIMITS) -> "SamplingParams":
        tokens = self.max_tokens
        if isinstance(tokens, int) and not isinstance(tokens, bool):  # the range that applies, before its floor (0)
            check(1 <= tokens <= max_tokens_limit or (tokens == 0 and self.prompt_logprobs is True), "max_tokens",
                  f"must be between 1 and {max_tokens_limit}, got {tokens}")  # 0 only scores a prompt
        for f in request_fields():
            self._check(f)
        limits.check_stop(self.stop)
        check(all(isinstance(s, str) and s for s in self.stop), "stop",
              "stop sequences must be non-empty strings")
        self._check_constraint(limits)
        return self

    def _check_constraint(self, limits: RequestLimits) -> None:
        chosen = [f.name for f in constraint_fields() if getattr(self, f.name) not in (None, False, [])
                  and not (f.name == "tools" and self.tool_choice == "none")]
        check(len(chosen) <= 1, chosen[-1] if chosen else "", f"only one structured-output field may be set, "
              f"got {', '.join(chosen)}")
        check(all(isinstance(c, str) and c for c in self.choice), "choice", "choices must be non-empty strings")
        if chosen:
            limits.check_grammar(chosen[0], self.constraint()[1])  # type: ignore[index]

    def constraint(self) -> Optional[tuple[str, str]]:
        """(field, text) of the structured-output field set, if any: json_object is the JSON
        schema of any object, and choice its strings as a JSON list."""
        for f in constraint_fields():
            value = getattr(self, f.name)
            if value in (None, False, []):
                continue
            if f.name == "json_object":
                return f.name, '{"type": "object"}'
            if f.name == "tools":
                if self.tool_choice == "none":
                    continue
                return f.name, json.dumps({"tools": value, "tool_choice": self.tool_choice,
                                           "parallel_tool_calls": self.parallel_tool_calls})
            return f.name, json.dumps(value) if f.name == "choice" else value
        return None

    def _check(self, f: Field) -> None:
        """The declared type (strictly: true is not 1) and bounds of one field."""
        value, (kind, optional) = getattr(self, f.name), field_type(f)
        if value is None:
            check(optional, f.name, "must not be null")
            return
        if kind is float:
            check(isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value),
                  f.name, f"must be a finite number, got {value!r}")
            value = float(value)
            setattr(self, f.name, value)  # transformers' warpers insist on floats
        elif kind is list:
            item = item_type(f)
            check(isinstance(value, list) and all(isinstance(x, item) and not isinstance(x, bool) for x in value),
                  f.name, f"must be a list of {_ITEM_NAMES[item]}, got {value!r}")
        else:
            check(isinstance(value, kind) and (kind is bool or not isinstance(value, bool)), f.name,
                  f"must be {_KIND_NAMES[kind]}, got {value!r}")
        bounds = [(bound, f.metadata[bound]) for bound in _BOUNDS if bound in f.metadata]
        check(all(_BOUNDS[bound][0](value, limit) for bound, limit in bounds), f.name,
              f"must be {_range(bounds)}, got {value}")

    @property
    def greedy(self) -> bool:
        """Temperature 0 is the common API spelling of greedy decoding."""
        return not self.do_sample or self.temperature == 0

    def resolved_seed(self) -> Optional[int]:
        """Sampling without a seed still gets one, so it can be reported and replayed."""
        if self.greedy:
            return None
        return self.seed if self.seed is not None else random.getrandbits(64)


_KIND_NAMES = {int: "an integer", bool: "true or false", str: "a string"}
_ITEM_NAMES = {str: "strings", int: "integers"}
_BOUNDS: dict[str, tuple[Callable[[Any, Any], bool], str]] = {
    "ge": (operator.ge, ">="), "gt": (operator.gt, ">"), "le": (operator.le, "<="), "lt": (operator.lt, "<")}


def _range(bounds: list[tuple[str, Any]]) -> str:
    """A field's bounds, all of them, as its error states them: `between 1 and 16`, `> 0 and <= 1`, `>= 0`."""
    if [bound for bound, _ in bounds] == ["ge", "le"]:
        return f"between {bounds[0][1]} and {bounds[1][1]}"
    return " and ".join(f"{_BOUNDS[bound][1]} {limit}" for bound, limit in bounds)


def request_fields() -> list[Field]:
    """The options a request may set, in declaration order."""
    return [f for f in fields(SamplingParams) if not f.metadata.get("internal")]


def constraint_fields() -> list[Field]:
    """The structured-output request fields, of which a request sets at most one."""
    return [f for f in request_fields() if f.metadata.get("constraint")]


def field_type(f: Field) -> tuple[type, bool]:
    """(int | float | bool | str | list, whether null is allowed) of a request field."""
    annotation: Any = f.type
    optional = typing.get_origin(annotation) is typing.Union
    if optional:
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    return typing.get_origin(annotation) or annotation, optional


def item_type(f: Field) -> type:
    """A list field's item type: str (stop sequences, choices) or int (token ids)."""
    args = typing.get_args(field_type_annotation(f))
    return args[0] if args else str


def field_type_annotation(f: Field) -> Any:
    annotation: Any = f.type
    if typing.get_origin(annotation) is typing.Union:
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    return annotation


KV_CACHE_DTYPES = ("auto", "fp32", "fp16")  # EngineConfig.kv_cache_dtype's choices
QUANTS = settings.choices("LLM_QUANT")  # EngineConfig.quant's


def engine_option(env: str) -> Any:
    """An operator's option that an environment variable may also set (`with:` wins); its
    default is the variable's, declared once in contract/settings.py."""
    return field(default=settings.default(env), metadata={"env": env})


@dataclass
class EngineConfig:
    """What the service operator chooses; everything has a CPU-friendly default."""

    model: str
    device: Optional[str] = None  # None: cuda when available, else cpu
    # auto: bf16 on GPU when supported; on CPU int4 for 4-bit weights, else fp32
    dtype: str = engine_option("LLM_DTYPE")
    # a Hugging Face folder's Linear weights quantized at load into GGUF blocks (QUANTS; quantize_on_load.py):
    # auto is q8_0 for a folder of 16-bit weights on CPU, else none
    quant: str = engine_option("LLM_QUANT")
    # LoRA adapters served on the model, `name=path,...` (PEFT folders; engine/model/lora.py); a request picks
    # one by its model name, `MODEL:name` or `name`
    lora: str = engine_option("LLM_LORA")
    trust_remote_code: bool = False
    max_tokens_limit: int = 1024  # upper bound of a request's max_tokens
    max_running: int = 32  # requests decoded together in one batch
    max_waiting: int = 128  # requests queued behind them; beyond: overloaded
    # the KV cache, in tokens: every row's blocks, and the prefix cache's; or in bytes (0: by tokens)
    max_batch_tokens: int = engine_option("LLM_MAX_BATCH_TOKENS")
    kv_cache_bytes: int = engine_option("LLM_KV_CACHE_BYTES")
    # what the KV cache holds keys and values in (KV_CACHE_DTYPES); auto: fp16 for int4 weights (loader.pick_kv_dtype)
    kv_cache_dtype: str = engine_option("LLM_KV_CACHE_DTYPE")
    max_prefill_tokens: int = 512  # prompt tokens prefilled per step (chunked beyond)
    # on a GPU, decode steps replayed from captured CUDA graphs (cuda_graphs.py); no effect on CPU
    cuda_graphs: bool = engine_option("LLM_CUDA_GRAPHS")
    eos_token_ids: Optional[list[int]] = None  # None: from the model's generation config
    torch_threads: Optional[int] = None
    stream_interval: int = 1  # tokens per streamed document, unless a request sets its own
    stream_interval_ms: int = 0  # and at least this long between a stream's documents (0: off)
    core_process: bool = True  # the decode loop in its own process (False: a thread of the executor)
    prefix_caching: bool = engine_option("LLM_PREFIX_CACHING")  # reuse the KV of prompts already seen
    # prompt-lookup speculative decoding (speculation.py): drafts per step for greedy requests that do not
    # say (0: off; python -m benchmarks --speculation-sweep: sampled ones lose by it, so they speculate
    # only when they ask), from the longest earlier n-gram of ngram_max down to ngram_min tokens, while at
    # most max_rows rows run
    speculative_tokens: int = engine_option("LLM_SPECULATIVE_TOKENS")
    speculative_ngram_min: int = 1
    speculative_ngram_max: int = 4
    speculative_max_rows: int = 4
    # how long the model stays loaded after its last request (contract/keep_alive.py: "5m", seconds,
    # negative: for good); a request's keep_alive sets its own
    keep_alive: str = engine_option("LLM_KEEP_ALIVE")
    # a reasoning model's think markers (engine/policies/reasoning.py): auto (the chat template's <think> and
    # </think>, where it names them), off, or OPEN,CLOSE
    reasoning: str = engine_option("LLM_REASONING")
    limits: RequestLimits = field(default_factory=RequestLimits.from_env)  # request sizes

    def validate(self) -> "EngineConfig":
        for name in ("max_tokens_limit", "max_running", "max_waiting",
                     "max_batch_tokens", "max_prefill_tokens"):
            if getattr(self, name) < 1:
                raise ValidationError(name, f"must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.speculative_tokens <= MAX_SPECULATIVE_TOKENS:
            raise ValidationError("speculative_tokens", f"must be from 0 to {MAX_SPECULATIVE_TOKENS}, "
                                                        f"got {self.speculative_tokens}")
        if not 1 <= self.speculative_ngram_min <= self.speculative_ngram_max:
            raise ValidationError("speculative_ngram_min", "must be at least 1 and at most speculative_ngram_max")
        if self.kv_cache_bytes < 0:
            raise ValidationError("kv_cache_bytes", f"must be >= 0, got {self.kv_cache_bytes}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValidationError("kv_cache_dtype", f"must be one of {', '.join(KV_CACHE_DTYPES)}, "
                                                    f"got {self.kv_cache_dtype!r}")
        if self.quant not in QUANTS:
            raise ValidationError("quant", f"must be one of {', '.join(QUANTS)}, got {self.quant!r}")
        self.adapters()
        keep_alive_seconds(self.keep_alive)
        if not 0 <= self.stream_interval_ms < 60_000:
            raise ValidationError("stream_interval_ms", f"must be from 0 to 60000, got {self.stream_interval_ms}")
        return self

    def adapters(self) -> dict[str, str]:
        """The LoRA adapters, name -> folder, in the order `lora` gives them; a ValidationError naming
        `lora` for a malformed list."""
        found: dict[str, str] = {}
        for item in filter(None, (part.strip() for part in self.lora.split(","))):
            name, sep, path = (piece.strip() for piece in item.partition("="))
            if not sep or not name or not path or ":" in name:
                raise ValidationError("lora", f"expected name=path (a name without ':'), got {item!r}")
            if name in found:
                raise ValidationError("lora", f"adapter {name!r} is named twice")
            found[name] = path
        return found

    @staticmethod
    def from_env(environ: Optional[Mapping[str, str]] = None) -> dict[str, Any]:
        """The options that environment variables set (LLM_DTYPE, LLM_MAX_BATCH_TOKENS, ...), read
        by contract/settings.py's rule; only those set, so that an unset one leaves the default."""
        return {f.name: settings.read(f.metadata["env"], environ) for f in fields(EngineConfig)
                if "env" in f.metadata and settings.is_set(f.metadata["env"], environ)}
