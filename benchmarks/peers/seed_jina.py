"""Reproduces Jina's "LLM streaming" tutorial executor: /stream loops model.generate(max_new_tokens=1) over the whole sequence per token, no KV cache reuse.

As documented (docs.jina.ai, "Streaming LLM tokens"): the blocking generate call
runs inside the async generator, the tutorial's own two document types, a stop
at EOS without a final document. Only the model path and device are parameters.
Served by benchmarks/peers/seed_jina.yml (`jina flow`, gRPC), like the service.
"""
import os

import torch
from docarray import BaseDoc
from jina import Executor, requests
from transformers import AutoModelForCausalLM, AutoTokenizer

from benchmarks.peers import pick_device_dtype


class PromptDocument(BaseDoc):
    prompt: str
    max_tokens: int


class ModelOutputDocument(BaseDoc):
    token_id: int
    generated_text: str


class SeedJinaExecutor(Executor):
    def __init__(self, model: str = "", **kwargs):
        super().__init__(**kwargs)
        path = model or os.environ["LLM_MODEL"]
        self.device, dtype = pick_device_dtype()
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(self.device).eval()

    @requests(on="/stream")
    async def task(self, doc: PromptDocument, **kwargs) -> ModelOutputDocument:
        tokenizer = self.tokenizer
        input = tokenizer(doc.prompt, return_tensors="pt").to(self.device)
        input_len = input["input_ids"].shape[1]
        for _ in range(doc.max_tokens):
            output = self.model.generate(**input, max_new_tokens=1,
                                         pad_token_id=tokenizer.eos_token_id, do_sample=False)
            if output[0][-1] == tokenizer.eos_token_id:
                break
            yield ModelOutputDocument(
                token_id=output[0][-1],
                generated_text=tokenizer.decode(output[0][input_len:], skip_special_tokens=True),
            )
            input = {"input_ids": output, "attention_mask": torch.ones(1, len(output[0]), device=self.device)}
