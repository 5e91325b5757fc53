"""When a generation stops (TGI's StoppingCriteria): a pure check per token, and the
stop-sequence filter that keeps any part of a stop sequence from being streamed.

The filter takes the request's stop sequences and the chat format's turn markers (a base
model's next "User:", engine/frontend/chat.py) in one list, so that both are held back and
cut alike; it tells which ended the text, as the finish reasons differ: a request's stop is
reported by name, a turn marker ends the answer as an end-of-turn token would."""
from collections.abc import Sequence
from typing import Optional

from contract import FinishReason, SamplingParams


def stop_reason(token: int, generated: int, params: SamplingParams,
                eos_token_ids: frozenset[int]) -> Optional[FinishReason]:
    """Why the generation ends with this token (its `generated`-th), if it does; stop
    sequences are found in the text, by StopSequenceFilter."""
    if token in eos_token_ids and not params.ignore_eos:
        return FinishReason.EOS
    if generated >= params.max_tokens:
        return FinishReason.LENGTH
    return None


class StopSequenceFilter:
    """Holds back text that could still become a stop sequence, so none is streamed in part."""

    def __init__(self, stops: list[str], turn_markers: Sequence[str] = ()):
        own = [s for s in stops if s]
        self._own = frozenset(own)
        self._stops = own + [m for m in turn_markers if m and m not in self._own]  # the request's first
        self._text = ""
        self._emitted = 0
        self.hit: str | None = None  # the request's stop sequence that ended the text, once one did
        self.turn_ended = False  # whether a turn marker ended it instead

    def add(self, delta: str) -> tuple[str, bool]:
        """Return (text safe to emit, whether a stop sequence was hit)."""
        if not self._stops:
            return delta, False
        old_len = len(self._text)
        self._text += delta
        hit = self._first_stop(old_len)
        if hit is not None:
            stop = next(s for s in self._stops if self._text.startswith(s, hit))
            if stop in self._own:
                self.hit = stop
            else:
                self.turn_ended = True
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
