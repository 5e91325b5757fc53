"""What a foreign API's request fields do here, declared once per API: served, accepted with no
effect on the answer, or refused unless they hold a neutral value. The routes check requests
against the declaration, and docs/api.md's field tables are checked against it, so a field a
client sends is never silently ignored: one that no declaration names is refused too."""
from dataclasses import dataclass
from enum import Enum

from pydantic import BaseModel

from gateway.mapping.inputs import BadRequest, refuse_unsupported


class Handling(Enum):
    SERVED = "served"
    NO_EFFECT = "no effect"  # accepted: it names who asks, or asks for what happens anyway
    REFUSED = "refused"  # unless null or one of its neutral values


@dataclass(frozen=True)
class ApiField:
    name: str
    handling: Handling
    neutral: tuple = ()  # a refused field's values that ask for nothing more (accepted)


@dataclass(frozen=True)
class ApiFields:
    api: str  # as errors name it
    fields: tuple[ApiField, ...]

    def names(self, handling: Handling) -> set[str]:
        return {f.name for f in self.fields if f.handling is handling}

    def check(self, request: BaseModel) -> None:
        """Refuse a field that no declaration names, or a refused one with a value that is not
        neutral. The request model declares the served and no-effect fields; the rest arrive as
        its extras."""
        for name in request.model_extra or {}:
            if name not in {f.name for f in self.fields}:
                raise BadRequest(f"{name}: not a field of {self.api} that this server knows", name)
        refuse_unsupported(request, {f.name: f.neutral for f in self.fields if f.handling is Handling.REFUSED})


def served(*names: str) -> tuple[ApiField, ...]:
    return tuple(ApiField(name, Handling.SERVED) for name in names)


def no_effect(*names: str) -> tuple[ApiField, ...]:
    return tuple(ApiField(name, Handling.NO_EFFECT) for name in names)


def refused(name: str, *neutral: object) -> ApiField:
    return ApiField(name, Handling.REFUSED, neutral)
