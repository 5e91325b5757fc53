"""Documents <-> engine types: the one place where the two meet."""
import json
from dataclasses import fields
from typing import Any, Optional, Union

from contract import SamplingParams, ServerInfo, ValidationError, kind_of, request_fields
from contract.blocks import BLOCK_SIZE
from engine import EngineClient, PromptScores, RequestOutput
from schemas import ModelOutputDocument, PromptDocument, Seed


def to_request(doc: PromptDocument) -> tuple[Union[str, list[int]], SamplingParams, Optional[str]]:
    """(prompt, as text or token ids; params; chat messages as JSON or None); the engine validates
    and renders."""
    if doc.prompt_token_ids and (doc.prompt or doc.messages):
        raise ValidationError("prompt_token_ids", "a prompt is text, token ids or chat messages: give one of them")
    params = SamplingParams(**{f.name: getattr(doc, f.name) for f in request_fields()})
    params.stop = list(params.stop or [])
    params.resume_tokens = list(params.resume_tokens or [])
    return list(doc.prompt_token_ids) or doc.prompt, params, doc.messages or None


def to_document(out: RequestOutput, generated_text: str) -> ModelOutputDocument:
    """One streamed document (or a whole answer): `generated_text` is all text so far."""
    finish = out.finish_reason
    final = finish is not None
    first = out.index + 1 == len(out.token_ids)  # an answer's first document: it starts at token 0
    prompt = out.prompt
    return ModelOutputDocument(
        token_id=out.token_ids[-1] if out.token_ids else -1, token_ids=out.token_ids, text=out.text,
        reasoning=out.reasoning,
        texts=out.texts, generated_text=generated_text, index=out.index, choice_index=out.choice,
        logprob=out.logprobs[-1] if out.logprobs else 0.0, logprobs=out.logprobs,
        special=out.special[-1] if out.special else False, specials=out.special,
        finish_reason=finish.value if finish is not None else None,
        generated_tokens=out.generated_tokens if final else None,
        reasoning_tokens=out.reasoning_tokens if final and out.reasoning_tokens else None,
        prompt_tokens=out.prompt_tokens if final or first else None,  # first: for usage streamed up front
        cached_tokens=out.cached_tokens if final or first else None,
        stop_sequence=out.stop_sequence if final else None,
        seed=Seed(out.seed) if final and out.seed is not None else None,
        tokens=out.token_strs, alternative_counts=[len(a) for a in out.alternatives],
        alternative_ids=[i for a in out.alternatives for i, _, _ in a],
        alternative_texts=[t for a in out.alternatives for _, t, _ in a],
        alternative_logprobs=[lp for a in out.alternatives for _, _, lp in a],
        tool_call_indexes=[c.index for c in out.tool_calls], tool_call_ids=[c.id for c in out.tool_calls],
        tool_call_names=[c.name for c in out.tool_calls], tool_call_arguments=[c.arguments for c in out.tool_calls],
        **(_prompt_fields(prompt) if prompt is not None else {}))


def _prompt_fields(prompt: PromptScores) -> dict:
    alternatives = prompt.alternatives
    return dict(prompt_token_ids=prompt.token_ids, prompt_token_texts=prompt.texts, prompt_logprobs=prompt.logprobs,
                prompt_alternative_counts=[len(a) for a in alternatives],
                prompt_alternative_ids=[i for a in alternatives for i, _, _ in a],
                prompt_alternative_texts=[t for a in alternatives for _, t, _ in a],
                prompt_alternative_logprobs=[lp for a in alternatives for _, _, lp in a])


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
                      chat_template_text=_text(getattr(engine.tokenizer, "chat_template", None)))


def _text(template: Any) -> str:
    """A tokenizer's chat template: text, or none (some name several templates; those stay unshown)."""
    return template if isinstance(template, str) else ""
