"""How long a model stays loaded after its last request: Ollama's `keep_alive` as this service
reads it, per request and in LLM_KEEP_ALIVE alike.

A number is seconds; a text is Go's duration spelling as Ollama takes it ("5m", "1h30m", "90s",
"300"); a negative value keeps the model loaded for good, and 0 unloads it once its requests end.
"""
import math
import re
from typing import Optional, Union

from .errors import check

FOREVER = math.inf
_PART = re.compile(r"(-?\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def keep_alive_seconds(value: Union[str, int, float, None], field_name: str = "keep_alive") -> Optional[float]:
    """Seconds (FOREVER for a negative value); None when `value` is None (the server's own)."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        check(math.isfinite(value), field_name, f"must be a finite number of seconds, got {value!r}")
        return FOREVER if value < 0 else float(value)
    check(isinstance(value, str), field_name, f"must be seconds or a duration such as \"5m\", got {value!r}")
    text = value.strip()  # type: ignore[union-attr]
    if re.fullmatch(r"-?\d+(\.\d+)?", text):
        return keep_alive_seconds(float(text), field_name)
    parts = _PART.findall(text)
    check(bool(parts) and "".join(n + u for n, u in parts) == text, field_name,
          f"must be seconds or a duration such as \"5m\" or \"1h30m\", got {value!r}")
    seconds = sum(float(number) * _UNIT_S[unit] for number, unit in parts)
    return FOREVER if text.startswith("-") else seconds
