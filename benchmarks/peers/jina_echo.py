"""The serving ceiling: the service's own schemas and endpoints, and no model. /stream yields
max_tokens documents as fast as Jina takes them, so a benchmark of it measures the Flow
(executor runtime, gateway, client), not generation."""
from types import SimpleNamespace

from docarray import DocList
from jina import Executor, requests

from contract import EngineConfig
from engine.model.info import ModelInfo
from executors.convert import server_info
from schemas import ModelOutputDocument, PromptDocument

# what /info reports: the service's default limits, and no model (for the OpenAI and TGI routes)
NO_MODEL = SimpleNamespace(config=EngineConfig(model="none"), info=ModelInfo("cpu", "none", 1 << 20, 0.0),
                           tokenizer=None)


class JinaEchoExecutor(Executor):
    @requests(on="/stream")
    async def stream(self, doc: PromptDocument, **kwargs) -> ModelOutputDocument:
        text = ""
        for i in range(doc.max_tokens):
            last = i == doc.max_tokens - 1
            text += " x"
            yield ModelOutputDocument(token_id=87, token_ids=[87], text=" x", generated_text=text, index=i,
                                      logprob=0.0, logprobs=[0.0], specials=[False], texts=[" x"],
                                      finish_reason="length" if last else None,
                                      generated_tokens=doc.max_tokens if last else None,
                                      prompt_tokens=1 if last else None)

    @requests(on="/info")
    async def info(self, docs: DocList[PromptDocument], **kwargs) -> DocList[ModelOutputDocument]:
        return DocList[ModelOutputDocument]([ModelOutputDocument(text=server_info(NO_MODEL, "jina-echo").to_json())])

    @requests(on="/stats")
    async def stats(self, docs: DocList[PromptDocument], **kwargs) -> DocList[ModelOutputDocument]:
        return DocList[ModelOutputDocument]([ModelOutputDocument(text='{"healthy": true}')])
