"""Documents <-> engine types: the one place where the two meet."""
from typing import Optional

from schemas import ModelOutputDocument, PromptDocument

from executors.engine import (AsyncEngine, EngineDeadError, GenerationError, OverloadedError,
                              SamplingParams, StreamChunk, ValidationError)


def to_request(doc: PromptDocument) -> tuple[str, SamplingParams, Optional[str]]:
    """(prompt, params, chat messages as JSON or None); the engine validates and renders."""
    params = SamplingParams(
        max_tokens=doc.max_tokens, do_sample=doc.do_sample, temperature=doc.temperature,
        top_k=doc.top_k, top_p=doc.top_p, typical_p=doc.typical_p,
        repetition_penalty=doc.repetition_penalty, seed=doc.seed, stop=list(doc.stop or []))
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


def error_type(exc: BaseException) -> str:
    if isinstance(exc, ValidationError):
        return "validation"
    if isinstance(exc, OverloadedError):
        return "overloaded"
    if isinstance(exc, (GenerationError, EngineDeadError)):
        return "generation"
    return "internal"


def error_document(exc: BaseException, generated_text: str = "") -> ModelOutputDocument:
    """A stream never ends silently: failures arrive as a last document with `error` set.

    (An exception raised from a Jina streaming endpoint makes the client retry the
    whole request, repeating tokens, so errors travel as documents instead.)
    """
    return ModelOutputDocument(finish_reason="error", error=str(exc), error_type=error_type(exc),
                               error_field=getattr(exc, "field", None), generated_text=generated_text)


def model_info(engine: AsyncEngine, name: str) -> dict:
    """What gateways advertise (/info, /v1/models): the model id and the request limits."""
    loaded, config = engine.core.loaded, engine.config
    return {"model_id": name, "max_context": loaded.max_context,
            "max_tokens_limit": config.max_tokens_limit, "max_running": config.max_running,
            "max_waiting": config.max_waiting, "max_batch_tokens": config.max_batch_tokens,
            "device": str(loaded.device), "dtype": str(loaded.model.dtype).replace("torch.", ""),
            "chat_template": bool(getattr(engine.tokenizer, "chat_template", None))}
