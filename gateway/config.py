"""Every `LLM_*` variable the gateway reads, read once, into one record: where the ports bind, who
may call (the API key, browsers' origins), the debug pages, and how the router picks a replica.
The request limits (`LLM_MAX_*`) are the contract's (contract/limits.py), which the executor
reads too. Each gateway process reads the environment at its first use of `config()`."""
import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class GatewayConfig:
    host: str = ""  # LLM_HOST: the address both ports bind to; empty: all interfaces
    api_key: str = ""  # LLM_API_KEY: when set, every route but health, metrics and the chat page needs it
    cors_origins: tuple[str, ...] = ()  # LLM_CORS_ORIGINS: origins browsers may call from (`*`: any)
    http_debug: bool = False  # LLM_HTTP_DEBUG: /docs, /redoc, /openapi.json and /dry_run
    router: str = "cache-aware"  # LLM_ROUTER: cache-aware or round-robin
    router_poll_s: float = 0.5  # LLM_ROUTER_POLL_MS: how often each replica reports its load
    router_wait_s: float = 15.0  # LLM_ROUTER_WAIT_S: how long a request waits when no replica takes work
    balance_abs: int = 4  # LLM_ROUTER_BALANCE_ABS: requests of imbalance before load wins over the cache
    balance_rel: float = 1.5  # LLM_ROUTER_BALANCE_REL: and the busiest replica's load over the idlest's
    min_match: float = 0.3  # LLM_ROUTER_MIN_MATCH: the share of a prompt's blocks a cache hit needs
    resolve: bool = False  # LLM_ROUTER_RESOLVE=1: replicas are every address their host names resolve to

    @classmethod
    def from_env(cls, env: Optional[Mapping[str, str]] = None) -> "GatewayConfig":
        env = os.environ if env is None else env
        default = cls()
        return cls(
            host=env.get("LLM_HOST", ""),
            api_key=env.get("LLM_API_KEY", ""),
            cors_origins=tuple(o.strip().rstrip("/") for o in env.get("LLM_CORS_ORIGINS", "").split(",") if o.strip()),
            http_debug=env.get("LLM_HTTP_DEBUG", "").lower() in ("1", "true", "yes"),
            router=env.get("LLM_ROUTER", default.router),
            router_poll_s=int(env.get("LLM_ROUTER_POLL_MS", round(default.router_poll_s * 1000))) / 1000,
            router_wait_s=float(env.get("LLM_ROUTER_WAIT_S", default.router_wait_s)),
            balance_abs=int(env.get("LLM_ROUTER_BALANCE_ABS", default.balance_abs)),
            balance_rel=float(env.get("LLM_ROUTER_BALANCE_REL", default.balance_rel)),
            min_match=float(env.get("LLM_ROUTER_MIN_MATCH", default.min_match)),
            resolve=env.get("LLM_ROUTER_RESOLVE") == "1")


@functools.cache
def config() -> GatewayConfig:
    """This process's record, read at its first use."""
    return GatewayConfig.from_env()
