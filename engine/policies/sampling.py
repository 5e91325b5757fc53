"""Per-request token choice inside a shared batch (TGI's NextTokenChooser).

Plain greedy rows are chosen together with one argmax; rows with penalties or sampling run
their own transformers logits processors, so a request's tokens never depend on its
neighbours in the batch.

Sampling is counter-based: the draw for the answer's token at position p is a pure function of
(seed, p) (splitmix64, keyed by the seed), turned into a token by the inverse of the
distribution's cumulative sum. No generator carries state from one token to the next, so a
request continued from (prompt, seed, tokens so far), in another process or on another replica,
draws exactly what it would have drawn had it never stopped; and a speculating row's drafts
can be checked at any position in any order.
"""
from dataclasses import dataclass
from typing import Optional, cast

import torch
from transformers import (
    LogitsProcessor,
    LogitsProcessorList,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    TypicalLogitsWarper,
)

from contract import SamplingParams

from ..kernels import native

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15  # splitmix64's increment


@dataclass
class Choice:
    token_id: int
    logprob: Optional[float] = None  # the plain greedy rows' own, computed with the argmax


def _mix(x: int) -> int:
    """splitmix64's output function: 64 bits in, 64 well-mixed bits out."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def uniform(seed: int, position: int) -> float:
    """The draw in [0, 1) for the answer's token at `position`, a function of (seed, position) only."""
    return (_mix((_mix((seed + GOLDEN) & MASK64) + position * GOLDEN) & MASK64) >> 11) * 2.0 ** -53


def sample(scores: torch.Tensor, u: float) -> int:
    """The token whose share of the cumulative distribution of softmax(scores) holds u (in
    float64): a token the warpers or a constraint ruled out (-inf) is never chosen."""
    cdf = torch.softmax(scores.double(), dim=-1).cumsum(-1)
    token = int(torch.searchsorted(cdf, torch.tensor([u * float(cdf[-1])], dtype=torch.float64), right=True))
    if token >= cdf.shape[0]:  # u * total rounded up to the total: the last token that can be chosen
        token = int(torch.nonzero(torch.diff(cdf, prepend=cdf.new_zeros(1)) > 0)[-1])
    return token


class OutputPenalties(LogitsProcessor):
    """OpenAI's presence and frequency penalties: subtracted from the scores of tokens already
    generated (not the prompt's, as vLLM does), once for being there and once per time."""

    def __init__(self, presence: float, frequency: float, prompt_length: int):
        self.presence, self.frequency, self.prompt_length = presence, frequency, prompt_length

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        generated = input_ids[:, self.prompt_length:]
        counts = torch.zeros_like(scores).scatter_add_(1, generated, torch.ones_like(generated, dtype=scores.dtype))
        return cast(torch.FloatTensor, scores - self.frequency * counts - self.presence * (counts > 0).to(scores.dtype))


class TokenChooser:
    def __init__(self, params: SamplingParams, seed: Optional[int], prompt_length: int = 0):
        self.greedy = params.greedy
        self.seed = seed or 0  # sampling always has one (resolved_seed)
        self.processors = _processors(params, prompt_length)
        self.plain_greedy = self.greedy and not self.processors

    def choose(self, history: list[int], logits: torch.Tensor, position: int) -> Choice:
        """logits: [1, vocab] float32 for this request's token at `position` of its answer,
        which follows `history`."""
        scores = logits
        if self.processors:
            ids = torch.tensor([history], dtype=torch.long, device=logits.device)
            scores = self.processors(cast(torch.LongTensor, ids), scores)
        if self.greedy:
            return Choice(int(torch.argmax(scores, dim=-1)))
        return Choice(sample(scores[0].cpu(), uniform(self.seed, position)))


def _processors(params: SamplingParams, prompt_length: int) -> LogitsProcessorList:
    procs = LogitsProcessorList()
    if params.repetition_penalty != 1.0:
        procs.append(RepetitionPenaltyLogitsProcessor(params.repetition_penalty))
    if params.presence_penalty or params.frequency_penalty:
        procs.append(OutputPenalties(params.presence_penalty, params.frequency_penalty, prompt_length))
    if params.greedy:
        return procs
    if params.temperature != 1.0:
        procs.append(TemperatureLogitsWarper(params.temperature))
    if params.top_k > 0:
        procs.append(TopKLogitsWarper(params.top_k))
    if params.top_p < 1.0:
        procs.append(TopPLogitsWarper(params.top_p))
    if params.typical_p < 1.0:
        procs.append(TypicalLogitsWarper(params.typical_p))
    if params.min_p > 0.0:
        procs.append(MinPLogitsWarper(params.min_p))
    return procs


def greedy_choices(logits: torch.Tensor) -> list[Choice]:
    """All plain greedy rows of the batch at once: greedy.c on CPU, else one argmax and one
    logsumexp."""
    chosen = native.greedy(logits)
    if chosen is None:
        top = torch.argmax(logits, dim=-1)
        logprobs = logits.gather(1, top[:, None])[:, 0] - torch.logsumexp(logits, dim=-1)
        chosen = top.tolist(), logprobs.tolist()
    return [Choice(t, lp) for t, lp in zip(*chosen, strict=True)]
