"""Every `LLM_*` variable the gateway reads, read once, into one record: where the ports bind, who
may call (the API key, browsers' origins), the debug pages, and how the router picks a replica.
The variables (names, defaults, meanings, parsing) are declared in contract/settings.py; the
request limits (`LLM_MAX_*`) are the contract's (contract/limits.py), which the executor reads
too. Each gateway process reads the environment at its first use of `config()`."""
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Optional

from contract import settings
from contract.settings import default


@dataclass(frozen=True)
class GatewayConfig:
    host: str = default("LLM_HOST")
    api_key: str = default("LLM_API_KEY")
    cors_origins: tuple[str, ...] = ()  # LLM_CORS_ORIGINS, comma-separated
    http_debug: bool = default("LLM_HTTP_DEBUG")
    router: str = default("LLM_ROUTER")
    router_poll_s: float = default("LLM_ROUTER_POLL_MS") / 1000
    router_wait_s: float = default("LLM_ROUTER_WAIT_S")
    balance_abs: int = default("LLM_ROUTER_BALANCE_ABS")
    balance_rel: float = default("LLM_ROUTER_BALANCE_REL")
    min_match: float = default("LLM_ROUTER_MIN_MATCH")
    resolve: bool = default("LLM_ROUTER_RESOLVE")

    @classmethod
    def from_env(cls, env: Optional[Mapping[str, str]] = None) -> "GatewayConfig":
        def read(name: str) -> Any:
            return settings.read(name, env)
        origins = read("LLM_CORS_ORIGINS")
        return cls(
            host=read("LLM_HOST"),
            api_key=read("LLM_API_KEY"),
            cors_origins=tuple(o.strip().rstrip("/") for o in origins.split(",") if o.strip()),
            http_debug=read("LLM_HTTP_DEBUG"),
            router=read("LLM_ROUTER"),
            router_poll_s=read("LLM_ROUTER_POLL_MS") / 1000,
            router_wait_s=read("LLM_ROUTER_WAIT_S"),
            balance_abs=read("LLM_ROUTER_BALANCE_ABS"),
            balance_rel=read("LLM_ROUTER_BALANCE_REL"),
            min_match=read("LLM_ROUTER_MIN_MATCH"),
            resolve=read("LLM_ROUTER_RESOLVE"))


@functools.cache
def config() -> GatewayConfig:
    """This process's record, read at its first use."""
    return GatewayConfig.from_env()
