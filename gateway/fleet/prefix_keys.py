"""A request's prefix-cache keys, as the engine will compute them, for the router to predict
which replica holds its prompt's blocks (SGLang's cache-aware router keeps a tree of text; this
keeps the engine's own block keys, contract/blocks.py).

The tokenizer and the chat template come from the executor once (its /tokenizer endpoint), so
the gateway needs no model files and loads no engine: `tokenizers` (Rust) encodes, jinja2
renders as transformers does. Plain prompts and chats get the engine's exact keys. A chat with
tools, for a model whose template knows none, gets the engine's keys less the tools' preamble:
a key of its own, the same for every turn of that conversation, which is all that affinity needs.
"""
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Optional

from jinja2 import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from contract.blocks import adapter_root, chain_hashes


@dataclass(frozen=True)
class TokenizerSpec:
    """What the executor sends (executors/convert.py `tokenizer_spec`)."""

    tokenizer: str  # tokenizer.json
    chat_template: Optional[str]
    special_tokens: dict[str, str]  # bos_token, eos_token, ... as templates read them
    block_size: int

    @classmethod
    def from_json(cls, text: str) -> "TokenizerSpec":
        data = json.loads(text)
        return cls(data["tokenizer"], data.get("chat_template"), data.get("special_tokens") or {},
                   int(data["block_size"]))


def _raise(message: str) -> None:
    raise TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: Optional[int] = None,
            separators: Any = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class PrefixKeys:
    def __init__(self, spec: TokenizerSpec):
        self.spec = spec
        self.tokenizer = Tokenizer.from_str(spec.tokenizer)
        self.template = None
        if spec.chat_template:  # as transformers renders chat templates
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
            env.filters["tojson"] = _tojson
            env.globals.update(raise_exception=_raise, strftime_now=lambda f: datetime.now().strftime(f))
            self.template = env.from_string(spec.chat_template)
        bos = spec.special_tokens.get("bos_token")
        first = self.tokenizer.encode("a").ids[:1]
        self.strip_bos = bos if bos and first and first[0] == self.tokenizer.token_to_id(bos) else None

    def keys(self, prompt: str, messages: str, adapter: Optional[str] = None) -> list[int]:
        """The keys of the prompt's full blocks, as the engine keys them for the base model or
        `adapter`; [] where it cannot say (the engine will refuse the request, or the messages are
        not what a chat expects)."""
        try:
            text = self._chat(json.loads(messages)) if messages else prompt
        except (TemplateError, ValueError, TypeError, KeyError):
            return []
        return chain_hashes(self.tokenizer.encode(text).ids, adapter_root(adapter), self.spec.block_size) if text else []

    def _chat(self, messages: list[dict[str, Any]]) -> str:
        turns = [{"role": m["role"], "content": _text(m.get("content"))} for m in messages]
        if self.template is None:  # the engine's plain format (engine/frontend/chat.py)
            return "\n".join([f"{m['role'].capitalize()}: {m['content']}" for m in turns] + ["Assistant:"])
        text = self.template.render(messages=turns, add_generation_prompt=True, **self.spec.special_tokens)
        return text[len(self.strip_bos):] if self.strip_bos and text.startswith(self.strip_bos) else text


def _text(content: Any) -> str:
    """OpenAI's content parts keep their text parts, as the engine reads them."""
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return content if isinstance(content, str) else ""
