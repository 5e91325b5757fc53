"""Prompt-lookup speculative decoding: drafts from the row's own history, no second model.

The drafts are the tokens that followed the latest earlier occurrence of the history's last n
tokens (the longest n, from ngram_max down to ngram_min, that occurred before), as vLLM's n-gram
and TGI's and llama.cpp's prompt lookup propose them. They pay where the answer copies its input:
extraction, rewriting, code edits, answers that quote.

A step then computes the row's last token and its k drafts together, and the row's next tokens
are chosen one position after another from that step's logits, as one decode step each would
choose them, for as long as each chosen token is the draft that the next position assumed. The
engine computes a query the same way whatever else the forward pass holds (paged_attention.c,
int4's row-invariant matmuls), so those logits are bit for bit a plain decode step's, and the
tokens chosen from them are the plain decode's: greedy output is unchanged, and seeded sampling
draws from the same distributions with the same generator, one draw per token, so it is
unchanged too. (For a draft that is one token for sure, accepting it when the sampled token is
the draft is the standard acceptance rule: accepted with probability p(draft).)

Drafts cost: a step that checks k of them computes k more positions, and on a CPU whose matmuls
are compute-bound at a few rows that is far from free. So each row drafts only as many as pay
(`worth`): its own acceptance so far (`Acceptance`), against what steps of each size have cost
on this machine (`StepCosts`, measured as the engine runs), a cost that every row of the step
pays. Where drafts stop paying, a row decodes plainly; sizes not measured lately are tried
again, so a row whose answer starts to copy picks speculation up again.
"""
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class PromptLookup:
    """One row's index of its history's n-grams: where each last ended, for the drafts."""

    ngram_min: int
    ngram_max: int
    ends: dict[tuple[int, ...], int] = field(default_factory=dict)  # n-gram -> where its latest occurrence ended
    indexed: int = 0  # n-grams ending before this position are in `ends`

    def propose(self, history: list[int], k: int) -> list[int]:
        """Up to k drafts to follow `history`."""
        last = len(history)
        for end in range(max(self.indexed, 1), last):  # every n-gram that ends before the history's own end
            for n in range(self.ngram_min, min(self.ngram_max, end) + 1):
                self.ends[tuple(history[end - n:end])] = end
        self.indexed = max(self.indexed, last)
        for n in range(min(self.ngram_max, last), self.ngram_min - 1, -1):
            found = self.ends.get(tuple(history[last - n:]))
            if found is not None:
                return history[found:found + k]
        return []


@dataclass
class SpeculationCounts:
    """Since the engine started (its stats): steps that drafted, the drafts, and those the
    chosen tokens confirmed."""

    spec_drafts: int = 0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0


@dataclass
class Acceptance:
    """One row's drafts so far: tokens accepted, and the checks that refused one (at most one a step)."""

    accepted: int = 0
    refused: int = 0

    def record(self, drafted: int, accepted: int) -> None:
        self.accepted += accepted
        self.refused += accepted < drafted

    def rate(self) -> float:
        """The chance that a draft is accepted after the one before was: a geometric fit, with one
        of each to start from."""
        return (self.accepted + 1) / (self.accepted + self.refused + 2)


RETRY_STEPS = 256  # a size not measured for this many steps is tried again
EXPLORE = 0.05  # an unmeasured size's assumed extra cost per draft (relative): low, so it gets tried


@dataclass
class StepCosts:
    """Decode steps' seconds on this machine by the positions they compute (an exponential average
    of each size), for what k more positions cost against none."""

    seconds: dict[int, float] = field(default_factory=dict)
    measured_at: dict[int, int] = field(default_factory=dict)
    steps: int = 0

    def record(self, positions: int, seconds: float) -> None:
        self.steps += 1
        old = self.seconds.get(positions)
        self.seconds[positions] = seconds if old is None else 0.75 * old + 0.25 * seconds
        self.measured_at[positions] = self.steps

    def ratio(self, base: int, extra: int) -> float:
        """cost(base + extra) / cost(base); optimistic where either is unmeasured or stale."""
        fresh = [self.seconds.get(n) if self.steps - self.measured_at.get(n, -RETRY_STEPS) < RETRY_STEPS else None
                 for n in (base, base + extra)]
        if fresh[0] is None or fresh[1] is None or fresh[0] <= 0:
            return 1.0 + EXPLORE * extra
        return fresh[1] / fresh[0]


def worth(drafts: int, rate: float, ratio: Callable[[int], float], rows: int = 1) -> int:
    """How many of `drafts` to check: the k whose step makes the most expected tokens per cost
    (ratio(k), 1 for k = 0); 0 where none beats a plain step. The step's `rows` decoding rows all
    wait for the k more positions, and only this one gains from them: the others' token each
    plus this row's 1 + rate + ... + rate^k, against `rows` tokens for a plain step."""
    best, best_gain, expected = 0, 1.0, 1.0
    others = max(rows, 1) - 1
    for k in range(1, drafts + 1):
        expected += rate ** k
        gain = (others + expected) / (others + 1) / ratio(k)
        if gain > best_gain:
            best, best_gain = k, gain
    return best
