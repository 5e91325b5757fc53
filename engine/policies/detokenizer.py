"""Incremental detokenization.

Decoding each new token on its own breaks multi-byte characters and SentencePiece
spaces. Like TGI and vLLM we decode a short window twice, `ids[prefix:read]` and
`ids[prefix:]`, and emit the difference only once it no longer ends in U+FFFD.
"""
from typing import cast

from transformers import PreTrainedTokenizerBase

_REPLACEMENT = "\ufffd"


def byte_fallback_ids(tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    """Ids of SentencePiece byte tokens (<0xNN>), and the special tokens between them.

    The ByteFallback decoder turns a whole run of them into U+FFFDs when the run is not
    valid UTF-8, including bytes it had already decoded alone; so text is held back
    until the run ends, which keeps the stream equal to decode() of all ids.
    """
    # looked up by name (512 lookups) rather than by scanning the vocabulary (seconds for 262k tokens)
    names = [f"<0x{byte:02{case}}>" for byte in range(256) for case in "Xx"]
    unknown = tokenizer.unk_token_id
    found = cast(list[int], tokenizer.convert_tokens_to_ids(names))  # a list for a list
    ids = frozenset(i for name, i in zip(names, found, strict=True)
                    if i is not None and i != unknown and tokenizer.convert_ids_to_tokens(i) == name)
    # decode() drops skipped special tokens first, so a run can continue across them
    return ids | frozenset(tokenizer.all_special_ids) if ids else ids


class IncrementalDetokenizer:
    def __init__(self, tokenizer: PreTrainedTokenizerBase, hold_ids: frozenset[int] = frozenset(),
                 skip_special_tokens: bool = True):
        self._tokenizer = tokenizer
        self._hold_ids = hold_ids
        self._skip_special = skip_special_tokens
        self.ids: list[int] = []
        self._prefix = 0
        self._read = 0

    def _decode(self, ids: list[int]) -> str:
        return cast(str, self._tokenizer.decode(ids, skip_special_tokens=self._skip_special,
                                                clean_up_tokenization_spaces=False))

    def add(self, token_id: int) -> str:
        """Append one token; return the text it completes (maybe '')."""
        self.ids.append(token_id)
        if token_id in self._hold_ids:
            return ""
        prefix_text = self._decode(self.ids[self._prefix:self._read])
        full_text = self._decode(self.ids[self._prefix:])
        if len(full_text) > len(prefix_text) and not full_text.endswith(_REPLACEMENT):
            self._prefix, self._read = self._read, len(self.ids)
            return full_text[len(prefix_text):]
        return ""

    def flush(self) -> str:
        """At the end, text that never completed (an invalid byte run) is emitted as decode() would."""
        prefix_text = self._decode(self.ids[self._prefix:self._read])
        full_text = self._decode(self.ids[self._prefix:])
        self._prefix = self._read = len(self.ids)
        return full_text[len(prefix_text):]
