"""Sentence embeddings from a transformers encoder, as sentence-transformers makes them: the
tokens' last hidden states pooled (mean, CLS or max, per the model's 1_Pooling/config.json) over
the attention mask, then normalized to unit length when the model's modules.json says so. Inputs
longer than the model's max_seq_length (sentence_bert_config.json) are cut there, as
sentence-transformers does, unless the caller refuses them (`Embedder.too_long`).

Batched equals alone, bit for bit: texts run in groups of one token count (no padding), and the
encoder's Linear products go through dense_matmul.c (engine/model/fp32.py), which sums each output
in one order whatever the rows beside it.
"""
import time
from dataclasses import replace
from typing import Optional

import torch
from torch.nn import functional
from transformers import AutoModel, AutoTokenizer

from .embedder_info import describe_embedder
from .model.fp32 import install as fp32_layers


class Embedder:
    def __init__(self, source: str, threads: Optional[int] = None):
        started = time.perf_counter()
        if threads:
            torch.set_num_threads(threads)
        self.tokenizer = AutoTokenizer.from_pretrained(source)
        self.model = AutoModel.from_pretrained(source, dtype=torch.float32).eval()
        parameters = self.model.num_parameters()  # before the Linear weights become packed buffers
        fp32_layers(self.model)
        info = describe_embedder(source, time.perf_counter() - started)  # as the folder says it, loaded or not
        self.info = info if info.parameters else replace(info, parameters=parameters)  # no safetensors to count
        self.max_tokens, self.pooling, self.normalized = self.info.max_tokens, self.info.pooling, self.info.normalized

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

