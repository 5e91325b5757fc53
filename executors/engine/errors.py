"""The engine's error kinds; every transport maps them to its own status codes."""


class ValidationError(ValueError):
    """A request that cannot be served as given; `field` names the culprit."""

    def __init__(self, field_name: str, message: str):
        super().__init__(f"{field_name}: {message}")
        self.field = field_name


class OverloadedError(RuntimeError):
    """The service is at capacity; the client should retry later (HTTP 429)."""

    def __init__(self, message: str = "overloaded: too many requests, retry later"):
        super().__init__(message)


class EngineDeadError(RuntimeError):
    """The decode loop failed; requests in flight fail instead of hanging."""


def check(ok: bool, field_name: str, message: str) -> None:
    if not ok:
        raise ValidationError(field_name, message)
