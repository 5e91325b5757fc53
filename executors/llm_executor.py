"""The Jina executor: documents in, one document per generated token out.

Thin on purpose: the engine does the work on its own thread; this converts.
"""
import asyncio
import json
import os
import uuid
from typing import AsyncIterator, Optional

from docarray import DocList
from jina import Executor, requests

from schemas import ModelOutputDocument, PromptDocument

from executors.convert import error_document, model_info, to_document, to_request
from executors.engine import AsyncEngine, EngineConfig, StreamChunk
from executors.engine.loader import served_name


class LLMExecutor(Executor):
    def __init__(self, model: str = "", model_name: str = "", device: Optional[str] = None, dtype: str = "auto",
                 trust_remote_code: bool = False, max_tokens_limit: int = 1024,
                 max_running: int = 32, max_waiting: int = 128, max_batch_tokens: int = 32768,
                 max_prefill_tokens: int = 512, torch_threads: Optional[int] = None, **kwargs):
        super().__init__(**kwargs)
        model = model or os.environ.get("LLM_MODEL", "")
        if not model:
            raise ValueError("no model given: set LLM_MODEL to a hub id or a local folder, "
                             "or pass `model` under `with:` in jina.yml (`make model` builds a "
                             "small local one)")
        self.engine = AsyncEngine(EngineConfig(
            model=model, device=device, dtype=dtype, trust_remote_code=trust_remote_code,
            max_tokens_limit=max_tokens_limit, max_running=max_running, max_waiting=max_waiting,
            max_batch_tokens=max_batch_tokens, max_prefill_tokens=max_prefill_tokens,
            torch_threads=torch_threads))
        self.model_name = model_name or os.environ.get("LLM_MODEL_NAME") or served_name(model)
        loaded = self.engine.core.loaded
        self.logger.info(f"model {self.model_name} ({model}) on {loaded.device}, "
                         f"{str(loaded.model.dtype).removeprefix('torch.')}, context "
                         f"{loaded.max_context} tokens, loaded in {loaded.load_seconds:.1f} s")

    @requests(on="/stream")
    async def stream(self, doc: PromptDocument, **kwargs) -> ModelOutputDocument:
        """Yields one document per token; closing the stream aborts the generation."""
        text = ""
        try:
            async for chunk in await self._open(doc):
                text = chunk.generated_text
                yield to_document(chunk)
        except Exception as exc:  # noqa: BLE001 - every failure becomes a final error document
            yield error_document(exc, text)

    @requests(on="/generate")
    async def generate(self, docs: DocList[PromptDocument], **kwargs) -> DocList[ModelOutputDocument]:
        """Unary: one document per prompt with the whole text; prompts share the batch."""
        return DocList[ModelOutputDocument](await asyncio.gather(*(self._complete(d) for d in docs)))

    async def _complete(self, doc: PromptDocument) -> ModelOutputDocument:
        token_ids: list[int] = []
        logprobs: list[float] = []
        specials: list[bool] = []
        last = None
        try:
            async for chunk in await self._open(doc):
                token_ids += chunk.token_ids
                logprobs += chunk.logprobs
                specials += chunk.special
                last = chunk
        except Exception as exc:  # noqa: BLE001
            return error_document(exc, last.generated_text if last else "")
        out = to_document(last)
        out.token_ids, out.logprobs, out.specials = token_ids, logprobs, specials
        out.text = last.generated_text
        return out

    async def _open(self, doc: PromptDocument) -> AsyncIterator[StreamChunk]:
        """Start a generation that ends with the task serving it: when the caller goes away,
        Jina cancels that task, and the generation is aborted at once, whether or not
        anyone closes the generator that yields its documents (an abandoned one is only
        closed when it is garbage-collected)."""
        request_id = uuid.uuid4().hex
        task = asyncio.current_task()
        if task is not None:
            task.add_done_callback(lambda _: self.engine.abort(request_id))
        prompt, params, messages = to_request(doc)
        return await self.engine.open(prompt, params, messages, request_id)

    @requests(on="/stats")
    async def stats(self, docs: DocList[PromptDocument], **kwargs) -> DocList[ModelOutputDocument]:
        """Batch occupancy for operators and tests, as JSON in `text`."""
        return DocList[ModelOutputDocument]([ModelOutputDocument(text=json.dumps(self.engine.stats()))])

    @requests(on="/info")
    async def info(self, docs: DocList[PromptDocument], **kwargs) -> DocList[ModelOutputDocument]:
        """Model id and limits for gateways (/info, /v1/models), as JSON in `text`."""
        info = model_info(self.engine, self.model_name)
        return DocList[ModelOutputDocument]([ModelOutputDocument(text=json.dumps(info))])

    def close(self) -> None:
        self.engine.shutdown()
        super().close()
