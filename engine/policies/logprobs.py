"""Log probabilities as clients see them: each generated token's, and its likeliest
alternatives when asked (top_logprobs).

They describe the model's own distribution, vLLM's default ("raw"): the log-softmax of the
logits, restricted to what a structured-output constraint allows, before penalties,
temperature and top-k/top-p/min-p/typical warpers. So they are the same whatever a request
samples with, and they are computed row by row: a token's numbers do not depend on the batch.
"""
from typing import Any

import torch

from ..kernels import native
from ..outputs import Alternative


class TokenTexts:
    """Each token's text decoded alone (what OpenAI calls a logprob's `token`), cached."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            text = self._cache[token_id] = self.tokenizer.decode([token_id])
        return text


def log_softmax(logits: torch.Tensor) -> torch.Tensor:
    """[rows, vocab] logits' log-softmax: greedy.c's on CPU (the same bits on every CPU, and the
    greedy rows' own log probabilities), else PyTorch's."""
    logits = logits.float()
    ours = native.log_softmax(logits)
    return ours if ours is not None else torch.log_softmax(logits, dim=-1)


@torch.inference_mode()
def raw_logprob(logits: torch.Tensor, token: int, top_n: int, texts: TokenTexts) -> tuple[float, list[Alternative]]:
    """(log probability of `token`, the top_n likeliest tokens). logits: [vocab] of one row,
    -inf where a constraint forbids; forbidden tokens are never alternatives."""
    logprobs = log_softmax(logits[None])[0]
    alternatives: list[Alternative] = []
    if top_n:
        values, ids = logprobs.topk(top_n)
        alternatives = [(i, texts(i), v) for i, v in zip(ids.tolist(), values.tolist(), strict=True)
                        if v != float("-inf")]
    return float(logprobs[token]), alternatives
