"""Documents <-> engine types: the one place where the two meet."""
from dataclasses import fields
from typing import Optional

from executors.engine import EngineClient, SamplingParams, StreamChunk
from executors.engine.errors import kind_of
from executors.engine.params import request_fields
from schemas import ModelOutputDocument, PromptDocument


def to_request(doc: PromptDocument) -> tuple[str, SamplingParams, Optional[str]]:
    """(prompt, params, chat messages as JSON or None); the engine validates and renders."""
    params = SamplingParams(**{f.name: getattr(doc, f.name) for f in request_fields()})
    params.stop = list(params.stop or [])
    return doc.prompt, params, doc.messages or None


def to_document(chunk: StreamChunk) -> ModelOutputDocument:
    final = chunk.finish_reason is not None
    return ModelOutputDocument(
        token_id=chunk.token_ids[-1], token_ids=chunk.token_ids, text=chunk.text,
        generated_text=chunk.generated_text, index=chunk.index, logprob=chunk.logprobs[-1],
        logprobs=chunk.logprobs, special=chunk.special[-1], specials=chunk.special,
        finish_reason=chunk.finish_reason.value if final else None,
        generated_tokens=chunk.generated_tokens if final else None,
        prompt_tokens=chunk.prompt_tokens if final else None,
        seed=chunk.seed if final else None)


def error_document(exc: BaseException, generated_text: str = "") -> ModelOutputDocument:
    """A stream never ends silently: failures arrive as a last document with `error` set.

    (An exception raised from a Jina streaming endpoint makes the client retry the
    whole request, repeating tokens, so errors travel as documents instead.)
    """
    return ModelOutputDocument(finish_reason="error", error=str(exc), error_type=kind_of(exc).value,
                               error_field=getattr(exc, "field", None), generated_text=generated_text)


def model_info(engine: EngineClient, name: str) -> dict:
    """What gateways advertise (/info, /v1/models): the model, and the server's limits as
    EngineConfig and RequestLimits declare them."""
    info, config = engine.info, engine.config
    limits = {f.name: getattr(config, f.name) for f in fields(config) if f.name.startswith("max_")}
    return {"model_id": name, "max_context": info.max_context, **limits, **config.limits.as_dict(),
            "device": info.device, "dtype": info.dtype,
            "chat_template": bool(getattr(engine.tokenizer, "chat_template", None))}
