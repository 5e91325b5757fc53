"""What a foreign API's request fields do here, declared once per API: served, accepted with no
effect on the answer, or refused unless they hold a neutral value. The routes check requests
against the declaration, and docs/api.md's field tables are checked against it, so a field a
client sends is never silently ignored: one that no declaration names is refused too, naming it
(and the served field it most resembles, since most such fields are typos)."""
import difflib
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

from pydantic import BaseModel

from gateway.mapping.inputs import BadRequest
from schemas import PromptDocument


class Handling(Enum):
    SERVED = "served"
    NO_EFFECT = "no effect"  # accepted: it names who asks, or asks for what happens anyway
    REFUSED = "refused"  # unless null or one of its neutral values


@dataclass(frozen=True)
class ApiField:
    name: str
    handling: Handling
    neutral: tuple = ()  # a refused field's values that ask for nothing more (accepted)
    instead: str = ""  # a refused field's pointer to what is served in its place, for its error


@dataclass(frozen=True)
class ApiFields:
    api: str  # as errors name it
    fields: tuple[ApiField, ...]
    # the engine's request fields that this API also takes under their own names (served, as vLLM takes
    # top_k): docs/api.md's request fields table documents them, so the API's own table need not
    extensions: tuple[str, ...] = ()

    def names(self, handling: Handling) -> set[str]:
        names = {f.name for f in self.fields if f.handling is handling}
        return names | set(self.extensions) if handling is Handling.SERVED else names

    def check(self, request: BaseModel) -> None:
        """Refuse a field that no declaration names, or a refused one with a value that is not
        neutral. The request model declares the served and no-effect fields; the rest arrive as
        its extras."""
        extra = request.model_extra or {}
        self.check_names(extra)
        for f in self.fields:
            value = extra.get(f.name)
            if f.handling is Handling.REFUSED and value is not None and not _neutral(value, f.neutral):
                raise BadRequest(f"{f.name}: not supported by this server" + (f"; {f.instead}" if f.instead else ""),
                                 f.name)

    def check_names(self, names: Iterable[str]) -> None:
        """Refuse the first name that no declaration names, suggesting the accepted one it resembles."""
        known = {f.name for f in self.fields} | set(self.extensions)
        for name in names:
            if name not in known:
                like = difflib.get_close_matches(name, sorted(self.names(Handling.SERVED)
                                                              | self.names(Handling.NO_EFFECT)), n=1)
                raise BadRequest(f"{name}: not a field of {self.api} that this server knows"
                                 + (f"; did you mean {like[0]}?" if like else ""), name)


def _neutral(value: object, neutral: tuple) -> bool:
    """Whether a value is one of the neutral ones, type included (true is not 1)."""
    return any(value == n and type(value) is type(n) for n in neutral)


def served(*names: str) -> tuple[ApiField, ...]:
    return tuple(ApiField(name, Handling.SERVED) for name in names)


def no_effect(*names: str) -> tuple[ApiField, ...]:
    return tuple(ApiField(name, Handling.NO_EFFECT) for name in names)


def refused(name: str, *neutral: object, instead: str = "") -> ApiField:
    return ApiField(name, Handling.REFUSED, neutral, instead)


# where the request is the document itself (Jina's SSE route, the gRPC port): its fields, all served
PROMPT_DOCUMENT_FIELDS = ApiFields("PromptDocument", served(*PromptDocument.model_fields))
