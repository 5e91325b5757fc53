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
"""
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
