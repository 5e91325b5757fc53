"""What the server says about itself (/info, /v1/models, TGI's /info): one typed record,
built by the executor and read by every gateway route."""
import json
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Optional

from .errors import ModelNotServedError


@dataclass(frozen=True)
class ServerInfo:
    model_id: str  # the id the APIs report
    max_context: int  # the model's context, in tokens
    max_tokens_limit: int  # the server's upper bound of a request's max_tokens
    max_running: int
    max_waiting: int
    max_batch_tokens: int
    max_prefill_tokens: int
    max_body_bytes: int
    max_prompt_chars: int
    max_messages: int
    max_stop_sequences: int
    max_stop_chars: int
    max_grammar_bytes: int
    max_grammar_compile_ms: int
    device: str
    dtype: str
    chat_template: bool  # whether the model has its own chat template
    kv_cache_tokens: int = 0  # the KV cache's pool, in tokens: every row's blocks and the prefix cache's
    kv_block_size: int = 0  # tokens per block of the pool (and per block of the prefix cache)
    kv_window_tokens: int = 0  # the sliding-window layers' own pool, in tokens (0: the model has none)
    kv_cache_dtype: str = ""  # what the pool holds keys and values in (float32, float16, ...)
    prefix_caching: bool = False  # whether prompts reuse the cached blocks of prefixes already seen
    replicas: int = 1  # engine replicas behind the gateway
    routing: str = "cache-aware"  # how the gateway's router picks a replica (gateway/fleet/router.py)
    architecture: str = ""  # transformers' model_type: llama, gemma3, qwen2...
    parameters: int = 0
    weight_bytes: int = 0  # what the weights take in memory, as served
    chat_template_text: str = ""  # the model's chat template (Ollama's /api/show shows it)
    state: str = "loaded"  # loaded, loading or unloaded (engine/frontend/lifecycle.py)
    expires_at: Optional[float] = None  # when an idle model unloads (Unix time); None: not due to
    load_seconds: Optional[float] = None  # what its last load took, until its engine was ready
    adapters: list[str] = field(default_factory=list)  # the LoRA adapters it serves, by name (EngineConfig.lora)
    adapter: str = ""  # an adapter's own entry (`with_adapters`): its name, the model being its base

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "ServerInfo":
        data: dict[str, Any] = json.loads(text)
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})

    @property
    def max_concurrent(self) -> int:
        """Requests in flight before the server says 'overloaded': running and waiting."""
        return self.max_running + self.max_waiting


def adapter_id(model_id: str, adapter: str) -> str:
    """The id a LoRA adapter is served under: its base model's id, a colon, its name."""
    return f"{model_id}:{adapter}"


def with_adapters(info: ServerInfo) -> list[ServerInfo]:
    """The model's entry, then one per LoRA adapter it serves: the base's limits under the adapter's
    id, as /v1/models and Ollama's /api/tags list them."""
    return [info, *(replace(info, model_id=adapter_id(info.model_id, name), adapters=[], adapter=name)
                    for name in info.adapters)]


def resolve(name: Optional[str], infos: list[ServerInfo], field_name: str = "model") -> ServerInfo:
    """The entry (`with_adapters`' entries of the served models) that a request's `model` names:
    by `served_id`'s rule, or an adapter by its bare name (as vLLM names them)."""
    for info in infos:
        if info.adapter and name == info.adapter:
            return info
    ids = [info.model_id for info in infos]
    return infos[ids.index(served_id(name, ids, field_name))]


def served_id(name: Optional[str], ids: list[str], field_name: str = "model") -> str:
    """The served model that a request's `model` names: the first one when it names none; an
    id, or an id with Ollama's `:latest` tag; else ModelNotServedError (404) naming them all."""
    if not name:
        return ids[0]
    for model_id in ids:
        if name in (model_id, f"{model_id}:latest"):
            return model_id
    raise ModelNotServedError(name, ids, field_name)
