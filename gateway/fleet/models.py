"""Which of the Flow's generating deployments serves which model.

A Flow serves one model per generating deployment (`LLM_MODELS` has `make serve` write one per
model; a Flow of one's own may list several executors with their own `model` under `with:`). Each
deployment has its fleet of replicas (fleet.py), and every request goes to the fleet of the model
it names: the first one when it names none, a 404 naming the served ones when it names one that
none serves. The names come from each fleet's /info, asked once. A model's LoRA adapters are served
by its fleet, each under its own id (`MODEL:adapter`, or its bare name).
"""
import asyncio
import json
from typing import Optional

from contract import ServerInfo, resolve, with_adapters
from gateway.fleet.fleet import Fleet, merge_families


class ModelFleets:
    def __init__(self, fleets: list[Fleet]):
        self.fleets = fleets  # in the Flow's order: the first answers a request that names no model
        self._infos: dict[int, ServerInfo] = {}  # a fleet's place -> its model's /info, once asked

    async def ids(self) -> list[str]:
        """Each fleet's model id, in the Flow's order (asked once, together)."""
        return [info.model_id for info in await self._served()]

    async def _served(self) -> list[ServerInfo]:
        missing = [i for i in range(len(self.fleets)) if i not in self._infos]
        answers = await asyncio.gather(*(self.fleets[i].one("/info") for i in missing))
        for i, answer in zip(missing, answers, strict=True):
            self._infos[i] = ServerInfo.from_json(answer)
        return [self._infos[i] for i in range(len(self.fleets))]

    async def find(self, name: Optional[str]) -> tuple[Fleet, Optional[str], Optional[str]]:
        """(the fleet that serves `name`, the model's or adapter's id, the adapter's name or None);
        the first fleet, and no id, for no name (one model needs no /info for that);
        ModelNotServedError for a name none serves."""
        if not name:
            return self.fleets[0], None, None
        entries = [(i, entry) for i, info in enumerate(await self._served()) for entry in with_adapters(info)]
        chosen = resolve(name, [entry for _, entry in entries])
        fleet = self.fleets[next(i for i, entry in entries if entry is chosen)]
        return fleet, chosen.model_id, chosen.adapter or None

    async def unary(self, endpoint: str) -> Optional[str]:
        """/stats and /metrics for every model (the first's stats at the top, each model's under
        `models`; the metrics of all, each series with its model_name label); /info the first's."""
        if len(self.fleets) == 1 or endpoint not in ("/stats", "/metrics"):
            return await self.fleets[0].unary(endpoint)
        texts = await asyncio.gather(*(f.unary(endpoint) for f in self.fleets))
        if endpoint == "/metrics":
            return merge_families([("", text) for text in texts if text is not None])
        each = [json.loads(text or "{}") for text in texts]
        return json.dumps({**each[0], "healthy": all(s.get("healthy", False) for s in each),
                           "models": dict(zip(await self.ids(), each, strict=True))})

    async def infos(self) -> list[dict]:
        """Each model's /info (its fleet's), in the Flow's order, each followed by its adapters' entries:
        what /v1/models lists."""
        texts = await asyncio.gather(*(f.unary("/info") for f in self.fleets))
        return [json.loads(entry.to_json()) for text in texts if text is not None
                for entry in with_adapters(ServerInfo.from_json(text))]

    async def close(self) -> None:
        for fleet in self.fleets:
            await fleet.close()
