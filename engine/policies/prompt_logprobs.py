"""Prompt log probabilities (scoring a text): each prompt token's log probability given the
tokens before it, with its likeliest alternatives, as evaluation harnesses need them.

Only requests that ask pay: the prefill keeps its final hidden states (a hook on the
model's decoder) and the output head runs on that request's own positions, row by row. So a
prompt's numbers do not depend on its neighbours in the prefill group. A long prompt is
scored chunk by chunk as it is prefilled; its chunks are always max_prefill_tokens long,
so its numbers do not depend on the batch either.
"""
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:  # the executor's process imports this module and never needs transformers' models
    from transformers import PreTrainedModel

from ..outputs import PromptScores
from .logprobs import TokenTexts, log_softmax


@contextmanager
def final_hidden_states(model: "PreTrainedModel", wanted: bool) -> Iterator[list[torch.Tensor]]:
    """While the block runs, the decoder's last hidden states [rows, width, hidden] of each
    forward pass land in the yielded list (nothing is kept when not `wanted`)."""
    captured: list[torch.Tensor] = []
    if not wanted:
        yield captured
        return

    def keep(_module: Any, _args: Any, output: Any) -> None:
        captured.append(output[0] if isinstance(output, tuple) else output.last_hidden_state)

    handle = model.get_decoder().register_forward_hook(keep)
    try:
        yield captured
    finally:
        handle.remove()


@torch.inference_mode()
def score(model: "PreTrainedModel", hidden: torch.Tensor, next_ids: list[int], top_n: int,
          texts: TokenTexts, scores: PromptScores) -> None:
    """Append the scores of `next_ids`, each predicted by one row of hidden [len(next_ids),
    hidden] (the positions just before them)."""
    if not next_ids:
        return
    logits = model.get_output_embeddings()(hidden[None])[0].float()
    logprobs = log_softmax(logits)
    targets = torch.tensor(next_ids, device=logprobs.device)
    scores.logprobs += logprobs.gather(1, targets[:, None])[:, 0].tolist()
    if top_n:
        values, ids = logprobs.topk(top_n, dim=-1)
        scores.alternatives += [[(i, texts(i), v) for i, v in zip(row_ids, row_values, strict=True)]
                                for row_ids, row_values in zip(ids.tolist(), values.tolist(), strict=True)]
