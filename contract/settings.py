"""Every `LLM_*` environment variable of the service, declared once: its name, type, default,
meaning and the process that reads it. Product code reads these variables here and nowhere
else (tests/unit/test_settings.py scans for reads elsewhere); docs/configuration.md's table of
variables is rendered from SETTINGS (`markdown_table`), and a test keeps the two equal.

One rule for every variable:
- unset, or set to blank: its default; except a variable declared `blank_is_value`, where
  blank is a value of its own (LLM_EMBEDDING_MODEL= turns embeddings off);
- a boolean is on for 1, true, yes or on, off for 0, false, no or off (any case); anything
  else is refused;
- a whole number is digits only, within the declared bounds; a number is a decimal;
- a bad value is refused with a ValidationError whose field is the variable's name.

Where the earlier readers disagreed, this is the way they went: the engine options took any
value but 0/false/off as on ("no" was on), the gateway took only 1/true/yes as on (LLM_HTTP_DEBUG)
or only "1" (LLM_ROUTER_RESOLVE), and anything else silently as off. Now all three take the
rule above, and a value that is neither on nor off stops the process that reads it, naming
the variable, instead of being guessed. Whole numbers were checked as digits by the engine
options, as at least 1 by the request limits and by Python's int() in the gateway: each keeps
its bound here (`low`), and every one is digits only.

Values are read at each call (never cached here): each reader decides when it reads, as the
gateway reads its record once at its first use (gateway/config.py).
"""
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Optional

from .errors import ValidationError

ON = ("1", "true", "yes", "on")
OFF = ("0", "false", "no", "off")
GATEWAY, EXECUTOR, ENGINE, CLIENT, SERVE = ("gateway", "executor", "engine process", "client", "make serve")


@dataclass(frozen=True)
class Setting:
    name: str
    kind: type  # str, int, float or bool
    default: Any  # None: none (the reader decides what none means, as the meaning says)
    meaning: str  # one line, as docs/configuration.md shows it
    read_by: tuple[str, ...]  # which processes read it
    shown: str = ""  # the default as the docs write it, where its value alone says too little
    low: Optional[float] = None  # a number's bounds
    high: Optional[float] = None
    choices: tuple[str, ...] = ()  # a text's allowed values; () any
    blank_is_value: bool = False  # set to blank is a value of its own, not the default

    def parse(self, raw: str) -> Any:
        """The value of `raw` as this variable's type, or a ValidationError naming it."""
        text = raw.strip()
        if self.kind is bool:
            if text.lower() in ON:
                return True
            if text.lower() in OFF:
                return False
            raise ValidationError(self.name, f"expected one of {'/'.join(ON)} (on) or {'/'.join(OFF)} (off), "
                                             f"got {raw!r}")
        if self.kind is int:
            if not text.isdigit():
                raise ValidationError(self.name, f"expected a whole number, got {raw!r}")
            return self._bounded(int(text))
        if self.kind is float:
            try:
                number = float(text)
            except ValueError:
                raise ValidationError(self.name, f"expected a number, got {raw!r}") from None
            if number != number or number in (float("inf"), float("-inf")):
                raise ValidationError(self.name, f"expected a finite number, got {raw!r}")
            return self._bounded(number)
        if self.choices and text not in self.choices:
            raise ValidationError(self.name, f"must be one of {', '.join(self.choices)}, got {raw!r}")
        return text

    def _bounded(self, number: Any) -> Any:
        if self.low is not None and number < self.low:
            raise ValidationError(self.name, f"must be >= {self.low:g}, got {number:g}")
        if self.high is not None and number > self.high:
            raise ValidationError(self.name, f"must be <= {self.high:g}, got {number:g}")
        return number

    def shown_default(self) -> str:
        if self.shown:
            return self.shown
        if self.default is None:
            return "none"
        if self.kind is bool:
            return "on" if self.default else "off"
        return f"{self.default:g}" if self.kind is float else str(self.default)



_DECLARED = (
    # which model, and what it is called
    Setting("LLM_MODEL", str, None, "the model, as the `model` option: a local folder, a `.gguf` file or a hub id "
            "(the default is where `make model` puts the default model)", (EXECUTOR,),
            shown="`models/SmolLM2-135M-Instruct`"),
    Setting("LLM_MODELS", str, None, "several models, comma-separated, each served under its own name "
            "(`make serve` and `deploy/serve.py`; it replaces `LLM_MODEL`)", (SERVE,)),
    Setting("LLM_MODEL_NAME", str, None, "as the `model_name` option: the id that `/v1/models`, `/info` and "
            "responses report; none: the folder's (or file's) name", (EXECUTOR,)),
    Setting("LLM_EMBEDDING_MODEL", str, None, "the embedding executor's model (a sentence-transformers folder); "
            "blank: embeddings off", (EXECUTOR,), shown="`models/all-MiniLM-L6-v2` when `make model` fetched it",
            blank_is_value=True),
    # the engine's options (EngineConfig's fields that name these; `with:` wins)
    Setting("LLM_DTYPE", str, "auto", "as the `dtype` option (int4, fp32, bf16, fp16)", (EXECUTOR,)),
    Setting("LLM_QUANT", str, "auto", "as the `quant` option: a Hugging Face folder's weights quantized at load",
            (EXECUTOR,),
            choices=("auto", "none", "q8_0", "q4_k_m", "q4_0", "q4_1", "q5_0")),
    Setting("LLM_QUANT_CACHE", str, None, "where a folder's weights, once quantized at load, are kept for the "
            "next start ([models.md](models.md#a-hugging-face-folder))", (ENGINE,),
            shown="`~/.cache/llm-stream/quantized`"),
    Setting("LLM_SHARE_WEIGHTS", str, "auto", "whether the weights, in the kernels' layout, are mapped from a file "
            "that every engine process of the same model on this machine maps (one copy for all replicas): `on`, "
            "`off`, or `auto`: on where `LLM_REPLICAS` is over 1 "
            "([operations.md](operations.md#replicas-share-one-copy-of-the-weights))", (ENGINE,),
            choices=("auto", "on", "off")),
    Setting("LLM_WEIGHTS_CACHE", str, None, "where the shared weights' files are kept (`LLM_SHARE_WEIGHTS`)",
            (ENGINE,), shown="`~/.cache/llm-stream/weights`"),
    Setting("LLM_LORA", str, "", "as the `lora` option: LoRA adapters served on the model, `name=path,...`",
            (EXECUTOR,), shown="none"),
    Setting("LLM_MAX_BATCH_TOKENS", int, 32768, "as the `max_batch_tokens` option: the KV cache, in tokens",
            (EXECUTOR,), low=1),
    Setting("LLM_KV_CACHE_BYTES", int, 0, "as the `kv_cache_bytes` option: the KV cache in bytes instead "
            "(0: by tokens)", (EXECUTOR,), low=0),
    Setting("LLM_KV_CACHE_DTYPE", str, "auto", "as the `kv_cache_dtype` option (auto, fp32, fp16)", (EXECUTOR,)),
    Setting("LLM_CUDA_GRAPHS", bool, True, "as the `cuda_graphs` option: decode steps replayed from CUDA graphs "
            "on a GPU", (EXECUTOR,)),
    Setting("LLM_PREFIX_CACHING", bool, True, "as the `prefix_caching` option (0 turns it off)", (EXECUTOR,)),
    Setting("LLM_SPECULATIVE_TOKENS", int, 8, "as the `speculative_tokens` option: prompt-lookup drafts per step "
            "(0: off)", (EXECUTOR,), low=0),
    Setting("LLM_KEEP_ALIVE", str, "5m", "as the `keep_alive` option: how long the model stays loaded after its "
            "last request (negative: for good)", (EXECUTOR,)),
    Setting("LLM_REASONING", str, "auto", "as the `reasoning` option: a reasoning model's think markers "
            "(auto, off, or OPEN,CLOSE)", (EXECUTOR,)),
    Setting("LLM_ENGINE_STALL_S", float, 60.0, "seconds a busy engine process may stay silent before it counts "
            "as stalled and is replaced", (EXECUTOR,), low=0.001),
    Setting("LLM_ENGINE_AHEAD", str, None, "the engine process that `make serve`'s launcher starts before its own "
            "imports, for the first executor to claim: its socket's name, set by the launcher (`off`: none "
            "started)", (SERVE, EXECUTOR), shown="set by the launcher"),
    Setting("LLM_REPLICAS", int, 1, "engine replicas behind the gateway, each with its share of the cores "
            "(`make serve` and `deploy/serve.py`)", (SERVE, EXECUTOR, ENGINE), low=1, high=64),
    Setting("LLM_METRICS_PORT", int, None, "each executor serves its own `/metrics` on this port (for a scraper "
            "that reads pods)", (EXECUTOR,), low=1, high=65535),
    Setting("LLM_KERNEL_CACHE", str, None, "where the C kernels, compiled for this CPU at the first start, are "
            "kept for the next ([cpu-weights.md](cpu-weights.md#the-c-kernels))", (ENGINE,),
            shown="`~/.cache/llm-stream/kernels`"),
    Setting("LLM_IMPORTS_CACHE", str, None, "where transformers' index of its model folders is kept, so that "
            "its import does not read its 1,700 model files at each start", (ENGINE,),
            shown="`~/.cache/llm-stream/imports`"),
    Setting("LLM_KERNEL_FLAGS", str, "", "compiler flags after the kernels' own (`-O3 -march=native "
            "-ffp-contract=off ...`): `-mno-avx512f` builds the AVX2 path on an AVX-512 CPU, `-mno-avx -mno-avx2 "
            "-mno-fma -mno-f16c` the plain C one; every path gives the same bits "
            "([cpu-weights.md](cpu-weights.md#which-path-runs))", (ENGINE,), shown="none"),
    # the gateway
    Setting("LLM_GRPC_PORT", int, 12345, "the gateway's gRPC port (`make serve` and `deploy/serve.py` apply it; "
            "flows/llm.yml writes the default); the client's default port", (SERVE, CLIENT), low=1, high=65535),
    Setting("LLM_HTTP_PORT", int, 12346, "the gateway's HTTP port, as `LLM_GRPC_PORT`", (SERVE, CLIENT), low=1, high=65535),
    Setting("LLM_STOP_GRACE_S", float, 20.0, "seconds `make serve` gives the Flow to stop before it kills it",
            (SERVE,), low=0),
    Setting("LLM_HOST", str, "", "the address both gateway ports bind to", (GATEWAY,), shown="all interfaces"),
    Setting("LLM_API_KEY", str, "", "require `Authorization: Bearer <key>` (gRPC: that metadata) on every route "
            "but health, metrics and the chat page; the client sends it", (GATEWAY, CLIENT), shown="none"),
    Setting("LLM_CORS_ORIGINS", str, "", "origins (comma-separated, or `*`) that browsers may call from and open "
            "the WebSocket from", (GATEWAY,), shown="none"),
    Setting("LLM_HTTP_DEBUG", bool, False, "serves `/docs`, `/redoc`, `/openapi.json` and `/dry_run`; the Flow's start "
            "banner lists Swagger UI (`/docs`) and Redoc (`/redoc`) only then", (GATEWAY,)),
    Setting("LLM_ROUTER", str, "cache-aware", "how the gateway picks a replica, `cache-aware` by prefix and load "
            "([operations.md](operations.md#replicas))", (GATEWAY,),
            choices=("cache-aware", "round-robin")),
    Setting("LLM_ROUTER_POLL_MS", int, 500, "how often each replica reports its load, in milliseconds",
            (GATEWAY,), low=1),
    Setting("LLM_ROUTER_WAIT_S", float, 15.0, "how long a request waits when no replica takes work", (GATEWAY,),
            low=0),
    Setting("LLM_ROUTER_BALANCE_ABS", int, 4, "requests of imbalance before load wins over the cache", (GATEWAY,),
            low=0),
    Setting("LLM_ROUTER_BALANCE_REL", float, 1.5, "and the busiest replica's load over the idlest's", (GATEWAY,),
            low=0),
    Setting("LLM_ROUTER_MIN_MATCH", float, 0.3, "the share of a prompt's blocks a cache hit needs", (GATEWAY,),
            low=0, high=1),
    Setting("LLM_ROUTER_RESOLVE", bool, False, "replicas are every address their host names resolve to "
            "(Compose's scaled services)", (GATEWAY,)),
    # request limits: the gateway checks them while parsing, the executor again before any work
    Setting("LLM_MAX_BODY_BYTES", int, 2 * 1024 * 1024, "an HTTP body, a WebSocket message, a gRPC message "
            "(TGI's 2 MB)", (GATEWAY, EXECUTOR), low=1),
    Setting("LLM_MAX_PROMPT_CHARS", int, 200_000, "a prompt, or all chat messages' contents together",
            (GATEWAY, EXECUTOR), low=1),
    Setting("LLM_MAX_MESSAGES", int, 512, "chat messages in one request", (GATEWAY, EXECUTOR), low=1),
    Setting("LLM_MAX_STOP_SEQUENCES", int, 16, "stop sequences in one request", (GATEWAY, EXECUTOR), low=1),
    Setting("LLM_MAX_STOP_CHARS", int, 256, "characters of one stop sequence", (GATEWAY, EXECUTOR), low=1),
    Setting("LLM_MAX_GRAMMAR_BYTES", int, 64 * 1024, "a structured-output schema, regex, choice list or grammar, "
            "as UTF-8", (GATEWAY, EXECUTOR), low=1),
    Setting("LLM_MAX_GRAMMAR_COMPILE_MS", int, 200, "the grammar compiler's work bound (llguidance's lexer fuel, "
            "about 50k per ms)", (GATEWAY, EXECUTOR), low=1),
    Setting("LLM_RESUME_STREAMS", int, 256, "SSE streams kept for a reconnect with `Last-Event-ID` "
            "([operations.md](operations.md#streams-that-survive-a-dropped-connection))", (GATEWAY,), low=1),
    Setting("LLM_RESUME_BYTES", int, 64 * 1024 * 1024, "the bytes of their events in all", (GATEWAY,),
            shown="64 MiB", low=1),
    Setting("LLM_RESUME_SECONDS", int, 300, "how long one is kept after its reader left or it ended", (GATEWAY,),
            low=1),
)
SETTINGS: dict[str, Setting] = {s.name: s for s in _DECLARED}
assert len(SETTINGS) == len(_DECLARED), "a variable is declared twice"


def declared(name: str) -> Setting:
    try:
        return SETTINGS[name]
    except KeyError:
        raise KeyError(f"{name} is not declared in contract/settings.py") from None


def default(name: str) -> Any:
    """A variable's default, for a record whose field it sets (one declaration of the value)."""
    return declared(name).default


def choices(name: str) -> tuple[str, ...]:
    """A text variable's allowed values (for the record field it sets)."""
    return declared(name).choices


def is_set(name: str, env: Optional[Mapping[str, str]] = None) -> bool:
    """Whether the variable holds a value (blank counts only where blank is a value)."""
    setting = declared(name)
    raw = (os.environ if env is None else env).get(name)
    return raw is not None and (setting.blank_is_value or bool(raw.strip()))


def read(name: str, env: Optional[Mapping[str, str]] = None) -> Any:
    """The variable's value from `env` (this process's environment by default), as its type;
    its default when it holds none; a ValidationError naming it when the value is bad."""
    setting = declared(name)
    if not is_set(name, env):
        return setting.default
    return setting.parse((os.environ if env is None else env)[name])


def markdown_table() -> str:
    """docs/configuration.md's table of variables, as rendered from the declarations."""
    rows = ["| variable | default | read by | |", "| --- | --- | --- | --- |"]
    for s in _DECLARED:
        meaning = f"{s.meaning} ({', '.join(s.choices)})" if s.choices else s.meaning
        rows.append(f"| `{s.name}` | {s.shown_default()} | {', '.join(s.read_by)} | {meaning} |")
    return "\n".join(rows) + "\n"
