"""Sentence embeddings from a transformers encoder, as sentence-transformers makes them: the
tokens' last hidden states pooled (mean, CLS or max, per the model's 1_Pooling/config.json) over
the attention mask, then normalized to unit length when the model's modules.json says so. Inputs
longer than the model's max_seq_length (sentence_bert_config.json) are cut there, as
sentence-transformers does, unless the caller refuses them (`Embedder.too_long`).

Batched equals alone, bit for bit: texts run in groups of one token count (no padding), and the
encoder's Linear products go through dense_matmul.c (engine/model/fp32.py), which sums each output
in one order whatever the rows beside it.
"""
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch
from torch.nn import functional
from transformers import AutoModel, AutoTokenizer

from .model.fp32 import install as fp32_layers


@dataclass(frozen=True)
class EmbedderInfo:
    """What the service says about its embedding model."""

    model_id: str
    dimensions: int
    max_tokens: int  # per input, special tokens included
    pooling: str
    normalized: bool
    load_seconds: float
    architecture: str = ""  # transformers' model_type: bert...
    parameters: int = 0


class Embedder:
    def __init__(self, source: str, threads: Optional[int] = None):
        started = time.perf_counter()
        if threads:
            torch.set_num_threads(threads)
        folder = Path(source)
        self.tokenizer = AutoTokenizer.from_pretrained(source)
        self.model = AutoModel.from_pretrained(source, dtype=torch.float32).eval()
        parameters = self.model.num_parameters()  # before the Linear weights become packed buffers
        fp32_layers(self.model)
        config: dict = _json(folder / "sentence_bert_config.json", {})
        pooling: dict = _json(folder / "1_Pooling" / "config.json", {})
        modules: list = _json(folder / "modules.json", [])
        self.max_tokens = int(config.get("max_seq_length") or min(self.tokenizer.model_max_length, 512))
        self.pooling = next((mode for mode in ("cls", "max", "mean") if pooling.get(f"pooling_mode_{mode}_token")),
                            "mean")
        self.normalized = any(m.get("type", "").endswith("Normalize") for m in modules)
        self.info = EmbedderInfo(folder.resolve().name if folder.exists() else source, self.model.config.hidden_size,
                                 self.max_tokens, self.pooling, self.normalized, time.perf_counter() - started,
                                 str(self.model.config.model_type), parameters)

    def tokens(self, texts: list[str]) -> list[list[int]]:
        """Each text's token ids, special tokens included, not cut."""
        return self.tokenizer(texts, add_special_tokens=True, truncation=False)["input_ids"]

    def too_long(self, ids: list[list[int]]) -> Optional[int]:
        """The first input longer than the model takes (None: none is)."""
        return next((i for i, one in enumerate(ids) if len(one) > self.max_tokens), None)

    def embed(self, ids: list[list[int]]) -> list[list[float]]:
        """One vector per input (token ids, cut to max_tokens), in the inputs' order."""
        cut = [one[:self.max_tokens - 1] + one[-1:] if len(one) > self.max_tokens else one for one in ids]
        vectors: list[list[float]] = [[] for _ in cut]
        by_length: dict[int, list[int]] = {}
        for i, one in enumerate(cut):
            by_length.setdefault(len(one), []).append(i)
        with torch.inference_mode():
            for rows in by_length.values():
                batch = torch.tensor([cut[i] for i in rows])
                hidden = self.model(input_ids=batch, attention_mask=torch.ones_like(batch)).last_hidden_state
                for i, vector in zip(rows, self._pool(hidden).tolist(), strict=True):
                    vectors[i] = vector
        return vectors

    def _pool(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.pooling == "cls":
            pooled = hidden[:, 0]
        elif self.pooling == "max":
            pooled = hidden.max(dim=1).values
        else:
            pooled = hidden.sum(dim=1) / hidden.shape[1]
        return functional.normalize(pooled, p=2, dim=1) if self.normalized else pooled


def _json(path: Path, default: Any) -> Any:
    """A sentence-transformers config file's content, or `default` where the folder has none."""
    return json.loads(path.read_text()) if path.exists() else default
