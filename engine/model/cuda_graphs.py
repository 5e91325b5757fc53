"""Decode steps replayed from CUDA graphs (EngineConfig.cuda_graphs).

On a GPU, a small model's decode step is mostly the CPU launching kernels: transformers' eager
forward of GPT-2 small took about 9 ms of CPU a step on an H100, for far less GPU work. A CUDA
graph records a step's kernels once and launches them all again with one call.

A graph fixes every shape and address, so a step is captured per shape met: its rows padded to
the next power of two (up to max_running), each row's queries (its next token, then the
speculative drafts that the step checks) to the next power of two (up to 1 + the most drafts),
and its block tables to the next power of two of blocks (up to the model's context). The graphs
share one memory pool (one replays at a time). Padding rows and queries decode token 0 at
position 0 into the null block and see one key; a real row's table is padded with the null block,
masked (DecodeStep in paged_attention.py).

Steps where every row decodes its next token, with or without drafts, run so: prompt chunks and
rows that score their prompt run eagerly, as do models with a sliding window. A capture that fails
turns graphs off for the engine's life, with a warning; steps then run eagerly.
"""
import logging
from dataclasses import dataclass
from typing import Optional

import torch

from contract import MAX_SPECULATIVE_TOKENS, EngineConfig

from ..core.kv_pool import NULL_BLOCK, KVPool
from .loader import LoadedModel
from .paged_attention import DecodeStep

log = logging.getLogger(__name__)


def bucket(n: int, most: int) -> int:
    """The next power of two from n, at most `most` (a shape to capture)."""
    return min(1 << (n - 1).bit_length(), most)


@dataclass
class Captured:
    """One shape's static inputs, the step over them, its output and graph."""

    ids: torch.Tensor  # [1, rows * queries]
    positions: torch.Tensor  # [1, rows * queries]
    step: DecodeStep
    logits: Optional[torch.Tensor] = None  # [1, rows * queries, vocab]: the graph writes here at each replay
    graph: Optional[torch.cuda.CUDAGraph] = None  # None: the step runs eagerly over the buffers (tests on CPU)


class DecodeGraphs:
    """Captures decode steps by shape, then replays them; `run` returns None where it does not serve."""

    def __init__(self, model: torch.nn.Module, pool: KVPool, max_rows: int, max_context: int, capture: bool = True):
        self.model, self.pool, self.capture = model, pool, capture
        self.max_rows = max_rows
        self.max_queries = 1 + MAX_SPECULATIVE_TOKENS
        self.max_width = -(-max_context // pool.shape.block_size)
        self.no_mask = torch.ones((1, 1, 1, 1), dtype=torch.bool, device=pool.device)  # read by no layer
        self.captured: dict[tuple[int, int, int], Captured] = {}  # by (rows, queries, width)
        self.replays = 0
        self.failed: Optional[str] = None  # why capturing stopped
        self._mempool = torch.cuda.graph_pool_handle() if capture else None

    @classmethod
    def for_model(cls, loaded: LoadedModel, pool: KVPool, config: EngineConfig) -> Optional["DecodeGraphs"]:
        """Graphs where they apply: on CUDA, asked for, and a model without sliding windows (a pool
        of one KV cache group, the full-attention one: its slots and tables are the rows' own)."""
        text = loaded.model.config.get_text_config()
        if (loaded.device.type != "cuda" or not config.cuda_graphs or getattr(text, "sliding_window", None)
                or len(pool.groups) > 1):
            return None
        return cls(loaded.model, pool, config.max_running, loaded.max_context)

    def run(self, ids: list[list[int]], positions: list[list[int]], slots: list[list[int]],
            tables: list[list[int]]) -> Optional[torch.Tensor]:
        """Logits [tokens, vocab], in order, of a step where row i decodes ids[i] (its next token,
        then its drafts) at positions[i] into slots[i]."""
        size = self.pool.shape.block_size
        rows, most = len(ids), max(map(len, ids))
        width = -(-(max(p[-1] for p in positions) + 1) // size)
        if self.failed or rows > self.max_rows or most > self.max_queries or width > self.max_width:
            return None
        shape = bucket(rows, self.max_rows), bucket(most, self.max_queries), bucket(width, self.max_width)
        captured = self.captured.get(shape) or self._capture(*shape)
        if captured is None:
            return None
        self._fill(captured, ids, positions, slots, tables)
        if captured.graph is not None:
            with torch.cuda.device(self.pool.device):  # a graph replays on its own device's stream
                captured.graph.replay()
        else:
            captured.logits = self._forward(captured)
        self.replays += 1
        assert captured.logits is not None
        queries = shape[1]
        if queries == 1:
            return captured.logits[0, :rows]
        kept = [row * queries + j for row, row_ids in enumerate(ids) for j in range(len(row_ids))]
        return captured.logits[0, torch.tensor(kept, device=self.pool.device)]

    def _fill(self, captured: Captured, ids: list[list[int]], positions: list[list[int]], slots: list[list[int]],
              tables: list[list[int]]) -> None:
        """This step's rows into the shape's buffers; the rest is padding (token 0 in the null block)."""
        step = captured.step
        padded, width = step.tables.shape
        queries = step.seen.shape[1]
        n = padded * queries
        flat = [[0] * n, [0] * n, [NULL_BLOCK] * n, [1] * n]  # a padding query sees one key
        for row, (row_ids, row_positions, row_slots) in enumerate(zip(ids, positions, slots, strict=True)):
            at = slice(row * queries, row * queries + len(row_ids))
            flat[0][at], flat[1][at], flat[2][at] = row_ids, row_positions, row_slots
            flat[3][at] = [p + 1 for p in row_positions]
        columns = torch.tensor(flat)
        table = torch.full((padded, width), NULL_BLOCK, dtype=torch.long)
        for row, blocks in enumerate(tables):
            kept = blocks[:width]
            table[row, :len(kept)] = torch.tensor(kept)
        captured.ids[0].copy_(columns[0], non_blocking=True)
        captured.positions[0].copy_(columns[1], non_blocking=True)
        step.slots.copy_(columns[2], non_blocking=True)
        step.seen.view(-1).copy_(columns[3], non_blocking=True)
        step.tables.copy_(table, non_blocking=True)

    def _forward(self, captured: Captured) -> torch.Tensor:
        captured.step.prepare()
        return self.model(input_ids=captured.ids, position_ids=captured.positions, attention_mask=self.no_mask,
                          use_cache=False, paged=captured.step).logits

    def _capture(self, rows: int, queries: int, width: int) -> Optional[Captured]:
        device = self.pool.device

        def buffer(*shape: int) -> torch.Tensor:
            return torch.zeros(shape, dtype=torch.long, device=device)
        step = DecodeStep(self.pool, buffer(rows * queries), buffer(rows, width), buffer(rows, queries) + 1)
        captured = Captured(buffer(1, rows * queries), buffer(1, rows * queries), step)
        if not self.capture:
            self.captured[rows, queries, width] = captured
            return captured
        try:
            with torch.cuda.device(device):
                captured.graph = self._record(captured)
        except Exception as exc:  # the engine goes on eagerly: a failed capture must not fail requests
            self.failed = f"{type(exc).__name__}: {exc}"
            log.warning("CUDA graphs off: capturing a decode step of %d rows failed (%s); steps run eagerly",
                        rows, self.failed)
            return None
        self.captured[rows, queries, width] = captured
        log.info("captured a CUDA graph: decode step of %d rows, %d queries and %d keys each", rows, queries,
                 width * self.pool.shape.block_size)
        return captured

    def _record(self, captured: Captured) -> torch.cuda.CUDAGraph:
        """A warm-up forward on a side stream (lazy initialisations happen outside the capture), then the capture."""
        device = self.pool.device
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            self._forward(captured)
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._mempool, capture_error_mode="thread_local"):
            captured.logits = self._forward(captured)
        return graph
