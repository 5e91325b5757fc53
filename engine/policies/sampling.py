"""Per-request token choice inside a shared batch (TGI's NextTokenChooser).

Plain greedy rows are chosen together with one argmax; rows with penalties or
sampling run their own transformers logits processors and their own seeded
generator, so a request's tokens never depend on its neighbours in the batch.
"""
from dataclasses import dataclass, field
from typing import cast

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


@dataclass
class Choice:
    token_id: int
    logprob: float  # the model's own (logprobs.py), once the engine has filled it in
    alternatives: list[tuple[int, str, float]] = field(default_factory=list)  # top_logprobs


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
    def __init__(self, params: SamplingParams, seed: int | None, device: torch.device, prompt_length: int = 0):
        self.greedy = params.greedy
        self.processors = _processors(params, prompt_length)
        self.plain_greedy = self.greedy and not self.processors
        self.generator = None
        if not self.greedy and seed is not None:  # sampling always has a seed (resolved_seed)
            self.generator = torch.Generator(device=device).manual_seed(seed)

    def choose(self, history: list[int], logits: torch.Tensor) -> Choice:
        """logits: [1, vocab] float32 for this request's next token."""
        scores = logits
        if self.processors:
            ids = torch.tensor([history], dtype=torch.long, device=logits.device)
            scores = self.processors(cast(torch.LongTensor, ids), scores)
        logprobs = torch.log_softmax(scores, dim=-1)
        if self.greedy:
            token = int(torch.argmax(scores, dim=-1))
        else:
            token = int(torch.multinomial(logprobs.exp(), 1, generator=self.generator))
        return Choice(token, float(logprobs[0, token]))


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
