"""The service's error kinds and exceptions; each transport maps a kind to its own code
(contract/transport.py), one table per transport keyed by the enum."""
import enum


class ErrorKind(enum.StrEnum):
    """What went wrong, as every protocol reports it (`error_type`)."""

    VALIDATION = "validation"  # the request, as sent: 400/422, INVALID_ARGUMENT
    OVERLOADED = "overloaded"  # try again later: 429, RESOURCE_EXHAUSTED
    GENERATION = "generation"  # failed while generating: 500, or an error event mid-stream
    UNPROCESSABLE = "unprocessable"  # this request alone failed in the engine before its first token: 422
    NOT_FOUND = "not_found"  # no such model or route: 404
    AUTHENTICATION = "authentication"  # no or a wrong API key: 401, UNAUTHENTICATED
    INTERNAL = "internal"  # anything else: 500


def kind_of(exc: BaseException) -> ErrorKind:
    return getattr(exc, "kind", ErrorKind.INTERNAL)


class ValidationError(ValueError):
    """A request that cannot be served as given; `field` names the culprit."""

    kind = ErrorKind.VALIDATION

    def __init__(self, field_name: str, message: str):
        super().__init__(f"{field_name}: {message}")
        self.field = field_name
        self.message = message

    def __reduce__(self):  # it crosses the pipe from the engine process
        return type(self), (self.field, self.message)


class OverloadedError(RuntimeError):
    """The service is at capacity; the client should retry later (HTTP 429)."""

    kind = ErrorKind.OVERLOADED

    def __init__(self, message: str = "overloaded: too many requests, retry later"):
        super().__init__(message)


class EngineDeadError(RuntimeError):
    """The decode loop failed; requests in flight fail instead of hanging."""

    kind = ErrorKind.GENERATION


class GenerationError(RuntimeError):
    """A request failed after it started streaming."""

    kind = ErrorKind.GENERATION


class RequestFailedError(RuntimeError):
    """One request failed inside the engine (one of its own policies raised) and it alone ended:
    a 4xx before its first token, naming the cause (and the field, where one is to blame)."""

    kind = ErrorKind.UNPROCESSABLE

    def __init__(self, message: str, field_name: "str | None" = None):
        super().__init__(message)
        self.field = field_name

    def __reduce__(self):
        return type(self), (str(self), self.field)


class ModelNotServedError(LookupError):
    """A request for a model this server does not serve (HTTP 404): the message names the
    served ones, so that a typo is seen at once."""

    kind = ErrorKind.NOT_FOUND

    def __init__(self, name: str, served: "list[str]", field_name: str = "model"):
        names = "', '".join(served)
        super().__init__(f"{field_name}: the model '{name}' is not served here; this server serves '{names}'")
        self.field, self.name, self.served = field_name, name, list(served)

    def __reduce__(self):
        return type(self), (self.name, self.served, self.field)


def check(ok: bool, field_name: str, message: str) -> None:
    if not ok:
        raise ValidationError(field_name, message)
