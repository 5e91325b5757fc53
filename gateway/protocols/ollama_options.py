"""Ollama's request fields onto the contract's, declared once: what /api/chat, /api/generate and
their `options` take, and what each does here (served, no effect, or refused unless neutral).
docs/api.md's tables are checked against these declarations.

Ollama samples by default (temperature 0.8, top_k 40, top_p 0.9), as here; temperature 0 is
greedy. `repeat_penalty` is the engine's repetition_penalty, which covers the prompt and the
answer: `repeat_last_n` is served as -1 (all of it) or 0 (no penalty), and any value when no
penalty is asked. `num_predict` -1 and -2 (to the end of the context) mean as many tokens as the
server allows: min(max_tokens_limit, context / 2). `num_ctx` below the model's context bounds
the prompt and the answer together; at or above it, the model's own context bounds them.
"""
import json
from typing import Any, Optional, Union

from pydantic import BaseModel, ConfigDict, StrictBool, StrictFloat, StrictInt, StrictStr

from contract import ServerInfo, ValidationError
from contract.keep_alive import FOREVER, keep_alive_seconds
from gateway.mapping.api_fields import ApiFields, no_effect, refused, served
from gateway.mapping.inputs import BadRequest, Bool, Int, Number, Stop, stop_list
from gateway.mapping.policies import default_max_tokens, effort_budget

OLLAMA_DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.9}  # Ollama's own, when a request says none
_SHARED = ("model", "format", "options", "stream", "logprobs", "top_logprobs")
CHAT_FIELDS = ApiFields("Ollama's /api/chat", served(*_SHARED, "messages", "tools", "keep_alive", "think"))
GENERATE_FIELDS = ApiFields("Ollama's /api/generate", (
    *served(*_SHARED, "prompt", "system", "raw", "keep_alive", "think"),
    refused("suffix", ""), refused("template", ""), refused("context", []), refused("images", [])))
OPTIONS = ApiFields("Ollama's options", (
    *served("num_predict", "num_ctx", "temperature", "top_p", "top_k", "min_p", "typical_p", "seed", "stop",
            "repeat_penalty", "repeat_last_n", "presence_penalty", "frequency_penalty"),
    *no_effect("num_keep", "num_batch", "num_gpu", "main_gpu", "num_thread", "numa", "low_vram", "use_mmap",
               "use_mlock", "vocab_only", "logits_all", "embedding_only", "penalize_newline", "mirostat_tau",
               "mirostat_eta"),
    refused("mirostat", 0), refused("tfs_z", 1.0, 1)))


class Options(BaseModel):
    """`options`: the served ones typed; those with no effect taken as they come."""

    model_config = ConfigDict(extra="allow")
    num_predict: Int = None
    num_ctx: Int = None
    temperature: Number = None
    top_p: Number = None
    top_k: Int = None
    min_p: Number = None
    typical_p: Number = None
    seed: Int = None
    stop: Stop = None
    repeat_penalty: Number = None
    repeat_last_n: Int = None
    presence_penalty: Number = None
    frequency_penalty: Number = None
    num_keep: Any = None
    num_batch: Any = None
    num_gpu: Any = None
    main_gpu: Any = None
    num_thread: Any = None
    numa: Any = None
    low_vram: Any = None
    use_mmap: Any = None
    use_mlock: Any = None
    vocab_only: Any = None
    logits_all: Any = None
    embedding_only: Any = None
    penalize_newline: Any = None
    mirostat_tau: Any = None
    mirostat_eta: Any = None


class OllamaRequest(BaseModel):
    """What /api/chat and /api/generate share; a field neither declares arrives as an extra."""

    model_config = ConfigDict(extra="allow")
    model: Optional[StrictStr] = None
    format: Optional[Union[StrictStr, dict[str, Any]]] = None
    options: Optional[Options] = None
    stream: Bool = None  # absent: streamed
    logprobs: Bool = None
    top_logprobs: Int = None
    keep_alive: Optional[Union[StrictStr, StrictInt, StrictFloat]] = None
    think: Optional[Union[StrictBool, StrictStr]] = None


class ChatRequest(OllamaRequest):
    messages: Optional[list[Any]] = None
    tools: Optional[list[Any]] = None


class GenerateRequest(OllamaRequest):
    prompt: Optional[StrictStr] = None
    system: Optional[StrictStr] = None
    raw: Bool = None


def think_fields(value: Any) -> dict[str, Any]:
    """`think`: false ends the thinking at once (a budget of 0), true lets the model think as it
    goes, and a level ("low", "medium", "high") is OpenAI's effort's budget. A reasoning model's
    thoughts come apart from the answer whatever is asked (`thinking`)."""
    if value is None or value is True:
        return {}
    if value is False:
        return {"reasoning_budget": 0}
    return effort_budget(value, "think", also="true, false or ")


def keep_alive_field(value: Any) -> Optional[float]:
    """The contract's keep_alive (seconds; -1: for good) from Ollama's: a duration ("5m", "1h30m",
    "-1") or a number of seconds; None: the server's."""
    try:
        seconds = keep_alive_seconds(value)
    except ValidationError as exc:
        raise BadRequest(str(exc), "keep_alive") from None
    return -1.0 if seconds == FOREVER else seconds


def format_fields(value: Any) -> dict[str, Any]:
    """`format`: "json" (any JSON object) or a JSON schema, enforced while decoding."""
    if value in (None, ""):
        return {}
    if value == "json":
        return {"json_object": True}
    if isinstance(value, dict):
        return {"json_schema": json.dumps(value)}
    raise BadRequest(f'format: must be "json" or a JSON schema, got {value!r}', "format")


def option_fields(options: Optional[Options], info: ServerInfo) -> tuple[dict[str, Any], Optional[int]]:
    """(the contract's sampling fields, num_ctx when it bounds the request below the model's context)."""
    o = options or Options()
    OPTIONS.check(o)
    fields: dict[str, Any] = {"do_sample": True, **OLLAMA_DEFAULTS}
    for name in ("temperature", "top_p", "top_k", "min_p", "typical_p", "presence_penalty", "frequency_penalty"):
        if getattr(o, name) is not None:
            fields[name] = getattr(o, name)
    if o.seed is not None and o.seed >= 0:  # Ollama's -1: a random seed, drawn and reported
        fields["seed"] = o.seed
    fields["stop"] = stop_list(o.stop, drop_empty=True)
    fields.update(_penalty(o))
    fields["max_tokens"] = _max_tokens(o.num_predict, info)
    if o.num_ctx is not None and o.num_ctx < 1:
        raise BadRequest(f"num_ctx: must be at least 1, got {o.num_ctx}", "num_ctx")
    return fields, o.num_ctx if o.num_ctx is not None and o.num_ctx < info.max_context else None


def _penalty(o: Options) -> dict[str, Any]:
    if o.repeat_penalty in (None, 1, 1.0) or o.repeat_last_n == 0:
        return {}
    if o.repeat_last_n not in (None, -1):
        raise BadRequest(f"repeat_last_n: {o.repeat_last_n} is not served: the repetition penalty here covers the "
                         "prompt and the answer (-1), or nothing (0)", "repeat_last_n")
    return {"repetition_penalty": o.repeat_penalty}


def _max_tokens(num_predict: Optional[int], info: ServerInfo) -> int:
    if num_predict is None or num_predict in (-1, -2):
        return default_max_tokens(info)
    if num_predict < 1:  # 0 too: the engine's 0 scores a prompt, which Ollama's routes cannot report
        raise BadRequest(f"num_predict: must be -1, -2 or between 1 and {info.max_tokens_limit}, got {num_predict}",
                         "num_predict")
    return num_predict
