"""Incremental detokenization and stop-sequence hold-back.

Decoding each new token on its own breaks multi-byte characters and SentencePiece
spaces. Like TGI and vLLM we decode a short window twice, `ids[prefix:read]` and
`ids[prefix:]`, and emit the difference only once it no longer ends in U+FFFD.
"""
import re

from transformers import PreTrainedTokenizerBase

_REPLACEMENT = "\ufffd"
_BYTE_TOKEN = re.compile(r"^<0x[0-9A-Fa-f]{2}>$")


def byte_fallback_ids(tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    """Ids of SentencePiece byte tokens (<0xNN>), and the special tokens between them.

    The ByteFallback decoder turns a whole run of them into U+FFFDs when the run is not
    valid UTF-8, including bytes it had already decoded alone; so text is held back
    until the run ends, which keeps the stream equal to decode() of all ids.
    """
    ids = frozenset(i for t, i in tokenizer.get_vocab().items() if _BYTE_TOKEN.match(t))
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
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special,
                                      clean_up_tokenization_spaces=False)

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


class StopSequenceFilter:
    """Holds back text that could still become a stop sequence, so none is streamed in part."""

    def __init__(self, stops: list[str]):
        self._stops = [s for s in stops if s]
        self._text = ""
        self._emitted = 0

    def add(self, delta: str) -> tuple[str, bool]:
        """Return (text safe to emit, whether a stop sequence was hit)."""
        if not self._stops:
            return delta, False
        old_len = len(self._text)
        self._text += delta
        hit = self._first_stop(old_len)
        if hit is not None:
            out = self._text[self._emitted:hit]
            self._text = self._text[:hit]
            self._emitted = hit
            return out, True
        safe_end = max(self._emitted, len(self._text) - self._held_back())
        out = self._text[self._emitted:safe_end]
        self._emitted = safe_end
        return out, False

    def flush(self) -> str:
        out = self._text[self._emitted:]
        self._emitted = len(self._text)
        return out

    def _first_stop(self, old_len: int) -> int | None:
        found = [self._text.find(s, max(0, old_len - len(s) + 1)) for s in self._stops]
        found = [i for i in found if i >= 0]
        return min(found) if found else None

    def _held_back(self) -> int:
        """Length of the longest tail of the text that starts some stop sequence.

        Candidates are the places where a stop's first character occurs in the tail, so
        the work stays in str.find/startswith (C) rather than a Python loop per length.
        """
        longest = 0
        for stop in self._stops:
            tail = self._text[-(len(stop) - 1):] if len(stop) > 1 else ""
            i = tail.find(stop[0])
            while i != -1 and len(tail) - i > longest:
                if stop.startswith(tail[i:]):
                    longest = len(tail) - i
                    break
                i = tail.find(stop[0], i + 1)
        return longest
