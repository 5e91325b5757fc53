"""Each step's token masks for the constrained rows of a batch (structured.py compiles their
grammars): filled by llguidance while the forward pass runs, then applied to the logits."""
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Optional

import torch
from llguidance import LLExecutor, LLMatcher

from .structured import GrammarCompiler


class MaskFiller:
    """Each step's masks for the constrained rows: filled in llguidance's threads, on a
    thread of its own so that the forward pass runs meanwhile, then applied to the logits."""

    def __init__(self, grammars: GrammarCompiler):
        self.grammars = grammars  # its tokenizer's vocabulary sets the masks' width, once a row needs one
        self._executor = LLExecutor()
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llm-grammar-masks")
        self._bits = torch.arange(32, dtype=torch.int32)

    def start(self, rows: list[tuple[int, LLMatcher]]) -> Optional[Future]:
        """rows: (row in the logits, its matcher). None when no row is constrained."""
        if not rows:
            return None
        return self._thread.submit(self.fill, rows)

    def fill(self, rows: list[tuple[int, LLMatcher]]) -> tuple[list[int], torch.Tensor]:
        """(rows, their bitmasks [len(rows), words] int32: bit t of word w allows token 32w+t)."""
        tokenizer = self.grammars.tokenizer
        assert tokenizer is not None  # a constrained row's matcher was compiled with it
        words = (tokenizer.vocab_size + 31) // 32
        masks = torch.empty((len(rows), words), dtype=torch.int32)
        self._executor.unsafe_compute_mask_ptr([(m, i) for i, (_, m) in enumerate(rows)], masks.data_ptr(),
                                               words * 4, len(rows))
        return [row for row, _ in rows], masks

    @torch.inference_mode()
    def apply(self, filled: tuple[list[int], torch.Tensor], logits: torch.Tensor) -> None:
        """Disallowed tokens of each masked row to -inf, in place. logits: [rows, vocab]."""
        rows, masks = filled
        allowed = ((masks.unsqueeze(-1) >> self._bits) & 1).bool().view(len(rows), -1)
        vocab = logits.shape[-1]
        if allowed.shape[1] < vocab:  # ids past the tokenizer's vocabulary: never allowed
            allowed = torch.cat([allowed, allowed.new_zeros((len(rows), vocab - allowed.shape[1]))], 1)
        index = torch.tensor(rows, dtype=torch.long, device=logits.device)
        logits[index] = logits[index].masked_fill(~allowed[:, :vocab].to(logits.device), float("-inf"))

    def shutdown(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)
