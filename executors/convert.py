"""Documents <-> engine types: the one place where the two meet."""
import json
from collections.abc import Callable
from dataclasses import fields
from typing import Any, Optional, Union

from contract import SamplingParams, ServerInfo, ValidationError, kind_of, request_fields
from contract.blocks import BLOCK_SIZE
from engine import EngineClient, RequestOutput
from schemas import OUTPUT_FIELDS, ModelOutputDocument, OutputField, PromptDocument, Shown


def to_request(doc: PromptDocument) -> tuple[Union[str, list[int]], SamplingParams, Optional[str]]:
    """(prompt, as text or token ids; params; chat messages as JSON or None); the engine validates
    and renders."""
    if doc.prompt_token_ids and (doc.prompt or doc.messages):
        raise ValidationError("prompt_token_ids", "a prompt is text, token ids or chat messages: give one of them")
    params = SamplingParams(**{f.name: plain(getattr(doc, f.name)) for f in request_fields()})
    params.stop = list(params.stop or [])
    params.resume_tokens = list(params.resume_tokens or [])
    return list(doc.prompt_token_ids) or doc.prompt, params, doc.messages or None


def plain(value: Any) -> Any:
    """A document's value as the built-in type it subclasses (the seed is a `schemas.Seed`, an int):
    the request is pickled to the engine process, which would import schemas, DocArray and pydantic
    to unpickle one (0.4 s at the first request, and their memory ever after)."""
    for kind in (bool, int, float, str):
        if isinstance(value, kind):
            return value if type(value) is kind else kind(value)
    return value


def to_document(out: RequestOutput, generated_text: str, load_seconds: Optional[float] = None) -> ModelOutputDocument:
    """One streamed document (or a whole answer): `generated_text` is all text so far;
    `load_seconds`, how long the request waited for its model to load (None: it did not)."""
    return ModelOutputDocument(generated_text=generated_text, load_seconds=load_seconds, **document_fields(out))


def document_fields(out: RequestOutput, declared: tuple[OutputField, ...] = OUTPUT_FIELDS) -> dict[str, Any]:
    """The document's fields of an output, each as its row in OUTPUT_FIELDS says: what it shows
    of which output field, and on which of the answer's documents (the others keep the default)."""
    every, first_and_last, last = _plan(declared)
    final = out.finish_reason is not None
    first = out.index + 1 == len(out.token_ids)  # an answer's first document: it starts at token 0
    values: dict[str, Any] = {}
    for rows in (every, first_and_last if final or first else (), last if final else ()):
        for name, source, value, sparse in rows:
            got = getattr(out, source)
            if not (sparse and not got):  # a sparse list of nothing: its default, built by the document
                values[name] = got if value is None else value(got)
    return values


Plan = tuple[tuple[str, str, Optional[Callable[[Any], Any]], bool], ...]
_PLANS: dict[int, tuple[tuple[OutputField, ...], tuple[Plan, Plan, Plan]]] = {}  # the declaration kept alive


def _plan(declared: tuple[OutputField, ...]) -> tuple[Plan, Plan, Plan]:
    """The rows an output fills, (name, source, value, sparse), for every document, the first and
    last, and the last: read once per declaration, as each token's document is built from them
    (a row's enum and attributes, read each time, tripled the time a document's fields take)."""
    if id(declared) not in _PLANS:
        plans = tuple(tuple((f.name, f.source, f.value, f.sparse) for f in declared
                            if f.source is not None and f.shown is shown)
                      for shown in (Shown.EVERY, Shown.FIRST_AND_LAST, Shown.LAST))
        _PLANS[id(declared)] = (declared, (plans[0], plans[1], plans[2]))
    return _PLANS[id(declared)][1]


def check_shown(output: type[RequestOutput] = RequestOutput, declared: tuple[OutputField, ...] = OUTPUT_FIELDS) -> None:
    """Refuse an output field that no document field shows, unless it says it travels otherwise
    (`metadata["document"] = False`: an error, as the error document), and a document field
    whose source is no output field: checked as this module loads, so that a field left out
    fails the executor's start instead of never reaching a reader."""
    names = {f.name for f in fields(output)}
    sources = {f.source for f in declared if f.source is not None}
    unshown = {f.name for f in fields(output) if f.metadata.get("document", True)} - sources
    if unshown or sources - names:
        raise TypeError(f"{output.__name__} and the document's fields disagree: no document field shows "
                        f"{sorted(unshown)}, no output field is {sorted(sources - names)}")


check_shown()


def error_document(exc: BaseException, generated_text: str = "") -> ModelOutputDocument:
    """A stream never ends silently: failures arrive as a last document with `error` set.

    (An exception raised from a Jina streaming endpoint makes the client retry the
    whole request, repeating tokens, so errors travel as documents instead.)
    """
    return ModelOutputDocument(finish_reason="error", error=str(exc), error_type=kind_of(exc).value,
                               error_field=getattr(exc, "field", None), generated_text=generated_text)


def tokenizer_spec(engine: EngineClient) -> str:
    """The tokenizer and chat template as JSON, for the gateway's router, which keys prompts as the
    engine does without the model's files (gateway/fleet/prefix_keys.py)."""
    tokenizer = engine.tokenizer
    return json.dumps({"tokenizer": tokenizer.backend_tokenizer.to_str(),
                       "chat_template": getattr(tokenizer, "chat_template", None),
                       "special_tokens": {k: v for k, v in tokenizer.special_tokens_map.items() if isinstance(v, str)},
                       "block_size": BLOCK_SIZE})


def server_info(engine: EngineClient, name: str) -> ServerInfo:
    """What gateways advertise (/info, /v1/models): the model, and the server's limits as
    EngineConfig and RequestLimits declare them."""
    info, config = engine.info, engine.config
    limits: dict[str, Any] = {f.name: getattr(config, f.name) for f in fields(config) if f.name.startswith("max_")}
    limits.update(config.limits.as_dict())
    stats = engine.stats()
    return ServerInfo(model_id=name, max_context=info.max_context, **limits,
                      device=info.device, dtype=info.dtype,
                      chat_template=bool(getattr(engine.tokenizer, "chat_template", None)),
                      kv_cache_tokens=stats["kv_blocks"] * BLOCK_SIZE, kv_block_size=BLOCK_SIZE,
                      kv_window_tokens=stats.get("kv_window_blocks", 0) * BLOCK_SIZE,
                      kv_cache_dtype=info.kv_cache_dtype, prefix_caching=config.prefix_caching,
                      architecture=info.architecture, parameters=info.parameters, weight_bytes=info.weight_bytes,
                      chat_template_text=_text(getattr(engine.tokenizer, "chat_template", None)),
                      adapters=list(config.adapters()))


def _text(template: Any) -> str:
    """A tokenizer's chat template: text, or none (some name several templates; those stay unshown)."""
    return template if isinstance(template, str) else ""
