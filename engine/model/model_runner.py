"""One forward pass for a step's work (scheduler.py): every row's new tokens packed into one
sequence with their own positions, their keys and values written to and read from the paged
pool (paged_attention.py). Decoding rows and prompt chunks share the pass; nothing is padded,
except in a decode step that a CUDA graph replays (cuda_graphs.py), speculative drafts and all.
"""
from dataclasses import dataclass
from itertools import accumulate
from typing import Optional

import torch

from ..core.kv_manager import KVCacheManager
from ..core.scheduler import Work
from ..policies.prompt_logprobs import final_hidden_states
from .cuda_graphs import DecodeGraphs
from .loader import LoadedModel
from .paged_attention import PagedStep

# transformers takes a 4-D mask as given instead of building one each forward: the paged
# attention needs none (each sequence's keys are its own)
NO_MASK = torch.ones((1, 1, 1, 1), dtype=torch.bool)


@dataclass
class StepResult:
    logits: torch.Tensor  # [positions that choose a token, vocab] float32, in the work's order: one per
    # row that reaches the end of its history, and one more per draft
    starts: list[int]  # where each work's tokens begin in the packed sequence
    hidden: Optional[torch.Tensor]  # [tokens, hidden]: the decoder's output, when a row scores its prompt


class ModelRunner:
    def __init__(self, loaded: LoadedModel, kv: KVCacheManager, graphs: Optional[DecodeGraphs] = None):
        self.model = loaded.model
        self.stack = loaded.plan.stack if loaded.plan is not None else None  # the C stack, or transformers' modules
        self.device = loaded.device
        self.kv = kv
        self.graphs = graphs
        self.lora = loaded.lora  # LoRA adapters: which one each token's row uses is set every step

    @torch.inference_mode()
    def run(self, work: list[Work], keep_hidden: bool = False) -> StepResult:
        ids = [w.request.tokens(w.start, w.start + w.count) + w.drafts for w in work]
        positions = [list(range(w.start, w.start + w.tokens)) for w in work]
        slots = [self.kv.slots(w.request, w.start, w.tokens) for w in work]
        tables = [self.kv.group_tables(w.request) for w in work]  # per row, each group's
        if self.graphs and not keep_hidden and all(w.count == 1 and w.samples for w in work):
            # graphs serve a pool of one group, the full-attention one: its slots and table are the row's
            replayed = self.graphs.run(ids, positions, slots, [groups[0] for groups in tables])
            if replayed is not None:
                return StepResult(replayed.float(), list(accumulate((len(i) for i in ids[:-1]), initial=0)), None)
        return self._eager(work, [t for i in ids for t in i], [p for ps in positions for p in ps],
                           [s for ss in slots for s in ss], tables, keep_hidden)

    def _eager(self, work: list[Work], ids: list[int], positions: list[int], slots: list[int],
               tables: list[list[list[int]]], keep_hidden: bool) -> StepResult:
        step = self._step([w.tokens for w in work], [w.start + w.tokens for w in work], slots, tables)
        chosen = [start + i for w, start in zip(work, step.q_starts, strict=True) if w.samples
                  for i in range(w.count - 1, w.tokens)]  # a row's last token's logits, and each draft's
        keep = 0 if len(chosen) == len(ids) else torch.tensor(chosen or [0], device=self.device)
        ids_t, positions_t = torch.tensor([ids], device=self.device), torch.tensor([positions], device=self.device)
        if self.lora is not None:
            self.lora.selection.choose([self.lora.index(w.request.adapter) for w in work], [w.tokens for w in work])
        try:
            if self.stack is not None:
                logits, hidden = self.stack.forward(ids_t, positions_t, step, keep)
            else:
                logits, hidden = self._forward(ids_t, positions_t, step, keep, keep_hidden)
        finally:
            if self.lora is not None:
                self.lora.selection.choose([], [])  # a direct forward after it is the base model's
        logits = logits[0].float()
        return StepResult(logits if chosen else logits[:0], step.q_starts, hidden[0] if keep_hidden else None)

    def _step(self, q_lens: list[int], ctx_lens: list[int], slots: list[int],
              tables: list[list[list[int]]]) -> PagedStep:
        """The step's inputs for every KV cache group alike: its slots (those of the tables, in
        `slots`, mapped into the group's pool) and each row's table (`tables[row][group]`)."""
        groups = [(torch.tensor(group_slots, device=self.device), [row[g] for row in tables])
                  for g, group_slots in enumerate(self.kv.group_slots(slots))]
        return PagedStep.grouped(self.kv.pool, q_lens, ctx_lens, groups)

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, step: PagedStep, keep: int | torch.Tensor,
                 keep_hidden: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """The model's own forward (the decoder's output caught on its way, when a row scores)."""
        with final_hidden_states(self.model, keep_hidden) as hidden:
            logits = self.model(input_ids=ids, position_ids=positions, attention_mask=NO_MASK, use_cache=False,
                                logits_to_keep=keep, paged=step).logits
        return logits, hidden[0] if keep_hidden else logits

    @torch.inference_mode()
    def probe(self) -> None:
        """One token through the model at start-up: every layer must go through the paged pool
        (a layer that kept its own cache would lose its keys between steps)."""
        blocks = self.kv.lend(1)
        assert blocks, "the pool has at least one block"
        size = self.kv.block_size
        slot = blocks[0] * size
        step = self._step([1], [1], [slot], [[[slots[0] // size] for slots in self.kv.group_slots([slot])]])
        zero = torch.zeros((1, 1), dtype=torch.long, device=self.device)
        try:
            if self.stack is not None:
                self.stack.forward(zero, zero, step, 0)
            else:
                self.model(input_ids=zero, position_ids=zero, attention_mask=NO_MASK, use_cache=False, paged=step)
        finally:
            self.kv.take_back(blocks)
        layers = self.kv.pool.shape.layers
        if sorted(step.counted) != list(range(layers)):
            raise RuntimeError(f"this model's attention does not go through transformers' attention interface in "
                               f"every layer ({len(step.counted)} of {layers} do): the engine cannot serve it")
