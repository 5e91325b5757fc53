"""The service's request and error vocabulary: what a request may ask, what the server
allows, what can go wrong, and what the server says about itself.

Every layer stands on it (the engine, the executor, the schemas, the gateway, the client)
and it imports nothing but the standard library, so reading it never loads torch.
"""
from .errors import (
    EngineDeadError,
    ErrorKind,
    GenerationError,
    ModelNotServedError,
    OverloadedError,
    RequestFailedError,
    ValidationError,
    check,
    kind_of,
)
from .info import ServerInfo, adapter_id, resolve, served_id, with_adapters
from .limits import DEFAULT_LIMITS, MAX_CHOICES, MAX_SPECULATIVE_TOKENS, MAX_TOP_LOGPROBS, SEED_MAX, RequestLimits
from .params import (
    EngineConfig,
    FinishReason,
    SamplingParams,
    field_type,
    item_type,
    request_field,
    request_fields,
)

__all__ = ["DEFAULT_LIMITS", "MAX_CHOICES", "MAX_SPECULATIVE_TOKENS", "MAX_TOP_LOGPROBS", "SEED_MAX", "EngineConfig", "EngineDeadError", "ErrorKind", "FinishReason",
           "GenerationError", "ModelNotServedError", "OverloadedError", "RequestFailedError", "RequestLimits", "SamplingParams", "ServerInfo",
           "ValidationError", "check", "field_type", "item_type", "kind_of", "request_field", "request_fields", "served_id", "adapter_id", "resolve", "with_adapters"]
