"""The Jina executor: documents in, one document per generated token out.

Thin on purpose: the engine does the work in its own process (or thread); this converts.
"""
import asyncio
import inspect
import json
import os
import sys
import uuid
from dataclasses import MISSING, fields, replace
from pathlib import Path
from typing import Any, AsyncGenerator, Optional, Union  # noqa: UP035 - Jina needs typing's (see stream)

from docarray import DocList
from jina import Executor, requests

from contract import EngineConfig, SamplingParams, ValidationError, resolve, settings, with_adapters
from contract.endpoints import KEEP_ALIVE
from contract.keep_alive import keep_alive_seconds
from contract.lifecycle import die_with_parent
from engine import CoreProcess, EngineClient, EngineProcess, ModelLifecycle, SpareCore, served_name
from executors import discovery
from executors.convert import error_document, server_info, to_document, to_request, tokenizer_spec
from executors.metrics import Metrics
from schemas import ModelOutputDocument, PromptDocument

die_with_parent()  # as soon as Jina loads this module in the process it forked: its start may take a while
discovery.install()  # the endpoints' schemas computed once, not at every gateway's ask

DEFAULT_MODEL = "models/SmolLM2-135M-Instruct"  # where `make model` puts the default model


def model_source(model: str = "") -> str:
    """The model to serve: `with:`'s, else LLM_MODEL's, else the default model where `make model` put
    it (paths are the Flow's working directory's, the repository root for `make serve`)."""
    source = model or settings.read("LLM_MODEL") or ""
    if source:
        return source
    if (Path(DEFAULT_MODEL) / "config.json").exists():
        return DEFAULT_MODEL
    raise ValueError(f"LLM_MODEL is not set, and the default model is not in {Path(DEFAULT_MODEL).absolute()}: "
                     "`make model` makes it there, or set LLM_MODEL to a local folder, a .gguf file or a hub id")


class LLMExecutor(Executor):
    """`with:` / `uses_with:` take `model_name` and any EngineConfig field (model, device,
    dtype, max_running, ...: see contract/params.py); the rest is Jina's."""

    def __init__(self, model_name: str = "", **kwargs: Any):
        die_with_parent()  # a Flow stopped while this loads must not leave it behind
        options = {**EngineConfig.from_env(),
                   **{f.name: kwargs.pop(f.name) for f in fields(EngineConfig) if f.name in kwargs}}
        super().__init__(**kwargs)
        discovery.prepare(self)  # while the model loads: the gateway asks as soon as this listens
        self._tokenizer: Optional[str] = None  # the router's tokenizer spec, made at its first ask
        options["model"] = model_source(options.get("model", ""))
        options.setdefault("torch_threads", share_of_cores())
        config = EngineConfig(**options)
        self.model_name = model_name or settings.read("LLM_MODEL_NAME") or served_name(options["model"])
        if self.model_name in config.validate().adapters():
            raise ValidationError("lora", f"adapter {self.model_name!r} has the model's own name; name it otherwise")
        self.metrics = Metrics(self.model_name, self.stats_now)
        ahead = _started_ahead()
        if ahead is not None and not config.core_process:
            ahead.discard()  # the decode loop runs in this process: no engine process takes it
        spare = SpareCore(ahead) if config.core_process else None  # then started when the model unloads
        self.model = ModelLifecycle(
            lambda: EngineProcess(config, spare=spare) if config.core_process else in_process(config),
            keep_alive_seconds(config.keep_alive) or 0.0, self._loaded, name=self.model_name, spare=spare,
            on_wait=self.metrics.load_waited)
        if (metrics_port := settings.read("LLM_METRICS_PORT")) is not None:  # a scraper reaches each pod directly
            self.metrics.serve(metrics_port)
        engine = self.model.load_now()  # at start: a model that cannot load stops the service
        info = engine.info
        where = "its own process" if config.core_process else "a thread"
        self.logger.info(f"model {self.model_name} ({options['model']}) on {info.device}, {info.dtype}, "
                         f"context {info.max_context} tokens, KV cache in {info.kv_cache_dtype}, loaded in "
                         f"{info.load_seconds:.1f} s; decode loop in {where}; unloaded after "
                         f"{config.keep_alive} idle (LLM_KEEP_ALIVE)")

    def _loaded(self, engine: EngineClient) -> None:
        """At each load: what the model says of itself stays known while it is unloaded."""
        engine.observer = self.metrics
        self.metrics.loaded(engine.start_stages)
        if stages := engine.start_stages:  # where its wait went (Jina's log: the engine's own is not shown)
            self.logger.info(f"model {self.model_name} ready in {stages['total']:.2f} s, "
                             f"{'a spare engine process taken' if stages['spare'] else 'its engine process started'}"
                             f": {json.dumps({k: round(v, 3) for k, v in stages.items()})}")
        self._info = server_info(engine, self.model_name)
        self._idle_stats = {**engine.stats(), "running": 0, "waiting": 0}
        self._load_stages = engine.start_stages

    def stats_now(self) -> dict:
        """The engine's numbers while loaded; while not, those it had when it loaded (idle, its steps at
        0, as after a restart: the router forgets what it predicted of its prefix cache, now gone)."""
        stats = self.model.engine.stats() if self.model.engine is not None else dict(self._idle_stats)
        spare = self.model.spare
        return {**stats, "model_state": self.model.status.value, "model_loads": self.model.loads,
                "model_unloads": self.model.unloads, "model_load_stages": self._load_stages,  # the last load's
                "spare": {"started": spare.started, "taken": spare.taken, "pid": spare.pid} if spare else None}

    @requests(on="/stream")
    async def stream(self, doc: PromptDocument, **kwargs) -> AsyncGenerator[ModelOutputDocument, None]:
        """Yields one document per token; closing the stream aborts the generation. (Jina reads the
        endpoint's output type out of typing's AsyncGenerator, not out of collections.abc's.)"""
        texts: dict[int, str] = {}  # each answer's text so far (n > 1: interleaved)
        try:
            request = self._request(doc)
            async with self.model.lease(request[1].keep_alive) as held:
                async for out in await held.engine.open(*request):
                    texts[out.choice] = texts.get(out.choice, "") + out.text
                    yield to_document(out, texts[out.choice], held.load_wait_s)
        except Exception as exc:  # noqa: BLE001 - every failure becomes a final error document
            yield error_document(exc, "".join(texts.values()) if len(texts) < 2 else "")

    @requests(on="/generate")
    async def generate(self, docs: DocList[PromptDocument], **kwargs) -> DocList[ModelOutputDocument]:
        """Unary: per prompt, one document with the whole text (n of them, in choice order,
        for n answers); prompts share the batch."""
        answers = await asyncio.gather(*(self._complete(d) for d in docs))
        return DocList[ModelOutputDocument]([doc for prompt in answers for doc in prompt])

    async def _complete(self, doc: PromptDocument) -> list[ModelOutputDocument]:
        try:
            request = self._request(doc)
            async with self.model.lease(request[1].keep_alive) as held:
                outs = await held.engine.complete(*request)
        except Exception as exc:  # noqa: BLE001
            return [error_document(exc)]
        return [to_document(out, out.text, held.load_wait_s) for out in outs]

    def _request(self, doc: PromptDocument) -> tuple[Union[str, list[int]], SamplingParams, Optional[str], str]:
        """The engine's request, whose generation ends with the task serving it: when the
        caller goes away, Jina cancels that task, and the generation is aborted at once,
        whether or not anyone closes the generator that yields its documents (an abandoned
        one is only closed when it is garbage-collected)."""
        request_id = uuid.uuid4().hex
        task = asyncio.current_task()
        if task is not None:
            task.add_done_callback(lambda _: self.model.abort(request_id))
        return (*self._to_request(doc), request_id)

    def _to_request(self, doc: PromptDocument) -> tuple[Union[str, list[int]], SamplingParams, Optional[str]]:
        """The engine's request, for this executor's model: a request that names another is
        refused (404) rather than answered by the wrong model (the gateway routes by the name)."""
        prompt, params, messages = to_request(doc)
        chosen = resolve(params.model, with_adapters(self._info))
        params.model = chosen.adapter or chosen.model_id  # an adapter by its name, as the engine knows it
        return prompt, params, messages

    @requests(on="/stats")
    async def stats(self, docs: DocList[PromptDocument], **kwargs) -> DocList[ModelOutputDocument]:
        """Batch occupancy for operators and tests, as JSON in `text`."""
        return DocList[ModelOutputDocument]([ModelOutputDocument(text=json.dumps(self.stats_now()))])

    @requests(on="/metrics")
    async def metrics_text(self, docs: DocList[PromptDocument], **kwargs) -> DocList[ModelOutputDocument]:
        """Prometheus text (vLLM's names) in `text`, for the gateway's GET /metrics."""
        return DocList[ModelOutputDocument]([ModelOutputDocument(text=self.metrics.text())])

    @requests(on="/info")
    async def info(self, docs: DocList[PromptDocument], **kwargs) -> DocList[ModelOutputDocument]:
        """Model id and limits for gateways (/info, /v1/models), as JSON in `text`."""
        info = replace(self._info, state=self.model.status.value, expires_at=self.model.expires_at,
                       load_seconds=self.model.load_seconds)
        return DocList[ModelOutputDocument]([ModelOutputDocument(text=info.to_json())])

    @requests(on="/tokenize")
    async def tokenize(self, docs: DocList[PromptDocument], **kwargs) -> DocList[ModelOutputDocument]:
        """The prompt's (or the chat's) token ids, in `token_ids`, as a request with these options would
        have them; an error document naming the field when it would be refused."""
        try:
            prompt, params, messages = self._to_request(docs[0])
            async with self.model.using(params.keep_alive) as engine:
                ids = await engine.tokenize(prompt, params, messages)
        except Exception as exc:  # noqa: BLE001 - refused: an error document
            return DocList[ModelOutputDocument]([error_document(exc)])
        return DocList[ModelOutputDocument]([ModelOutputDocument(token_ids=ids, prompt_tokens=len(ids))])

    @requests(on="/detokenize")
    async def detokenize(self, docs: DocList[PromptDocument], **kwargs) -> DocList[ModelOutputDocument]:
        """`prompt_token_ids` as text, in `text`."""
        try:
            async with self.model.using() as engine:
                text = engine.detokenize(list(docs[0].prompt_token_ids))
        except Exception as exc:  # noqa: BLE001
            return DocList[ModelOutputDocument]([error_document(exc)])
        return DocList[ModelOutputDocument]([ModelOutputDocument(text=text)])

    @requests(on="/tokenizer")
    async def tokenizer(self, docs: DocList[PromptDocument], **kwargs) -> DocList[ModelOutputDocument]:
        """The tokenizer and chat template, as JSON in `text`, for the gateway's router: made at its
        first ask and kept (the model's tokenizer never changes here). Only a router of several
        replicas asks, and writing Gemma 3's 262,144 tokens out took 0.5 s, which the start and
        every reload waited for when it was made at each load. Made on this loop, not a thread:
        the tokenizer's requests also set its truncation, and the two would meet in one object."""
        try:
            if self._tokenizer is None:
                async with self.model.using() as engine:
                    self._tokenizer = tokenizer_spec(engine)
        except Exception as exc:  # noqa: BLE001
            return DocList[ModelOutputDocument]([error_document(exc)])
        return DocList[ModelOutputDocument]([ModelOutputDocument(text=self._tokenizer)])

    @requests(on=KEEP_ALIVE)
    async def keep_alive(self, docs: DocList[PromptDocument], **kwargs) -> DocList[ModelOutputDocument]:
        """Load the model (unless `keep_alive` is 0) and keep it that long from now; 0 unloads it
        once its requests end (Ollama's request with no prompt). The model's info, as /info's."""
        try:
            keep = self._to_request(docs[0])[1].keep_alive
            if keep == 0:
                self.model.keep(0)
            else:
                await self.model.load(keep)
        except Exception as exc:  # noqa: BLE001 - a load that failed, or a keep_alive refused
            return DocList[ModelOutputDocument]([error_document(exc)])
        return await self.info(docs)

    def close(self) -> None:
        self.model.shutdown()
        super().close()


def _started_ahead() -> Optional[CoreProcess]:
    """The engine process that executors/early_engine.py started, where Jina imported it (jina.yml)."""
    early = sys.modules.get("executors.early_engine")
    return early.take() if early is not None else None


def share_of_cores() -> Optional[int]:
    """torch's threads for one of LLM_REPLICAS replicas on this machine (a Flow's replicas share
    it): its share of the cores; None for one replica (the engine's own choice)."""
    replicas = settings.read("LLM_REPLICAS")
    return max(1, len(os.sched_getaffinity(0)) // replicas) if replicas > 1 else None


def _signature() -> inspect.Signature:
    """What Jina reads to check `with:` keys: model_name and EngineConfig's fields."""
    keyword = inspect.Parameter.KEYWORD_ONLY
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
              inspect.Parameter("model_name", keyword, default="")]
    params += [inspect.Parameter(f.name, keyword, default=None if f.default is MISSING else f.default)
               for f in fields(EngineConfig)]
    return inspect.Signature(params + [inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)])


LLMExecutor.__init__.__signature__ = _signature()  # type: ignore[attr-defined]


def in_process(config: EngineConfig) -> EngineClient:
    """The decode loop on a thread of this process (`core_process: false`). Imported here, when
    asked for: only then does this process need the engine core and transformers' models."""
    from engine import AsyncEngine
    return AsyncEngine(config)
