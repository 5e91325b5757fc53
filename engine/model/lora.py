"""LoRA adapters served beside their base model, every adapter and the base in one batched step.

An adapter (a PEFT folder: adapter_config.json and adapter_model.safetensors) adds to some Linear
layers a low-rank product: y = base(x) + (x A^T) (s B)^T, with s = lora_alpha / r (or / sqrt(r)
for rsLoRA). The base layer is not changed: its quantized blocks stay as they are, and every
adapter's product runs beside them. One step holds rows of any adapters; each row's tokens get
their own adapter's product only (`Selection`, set by the model runner each step).

Why beside and not merged: a merged copy of the model per adapter costs a model's memory each,
and a request would need its own batch. vLLM, llama.cpp (`--lora`) and Ollama (`ADAPTER`) serve
adapters this way too.

Batched == alone: the low-rank products run in dense_matmul.c, whose sums of a row do not depend
on the batch (fp32.py), and a row's sum y + delta is its own. A row's numbers are thus its own
whatever adapters its neighbours use.

What an adapter may not hold, and is refused for at start, naming it: DoRA, bias training,
whole modules to save (`modules_to_save`), embedding or convolution adapters, and targets that are
not Linear layers of the base model.
"""
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch
from safetensors.torch import load_file
from torch import nn

from ..kernels import native
from .fp32 import Fp32Linear
from .placement import put

_PREFIX = "base_model.model."


@dataclass
class Selection:
    """Which adapter each of a step's tokens uses: (adapter index, its tokens' places in the
    packed step) for each adapter in the step. Empty: every token is the base model's (a direct
    forward, such as the start-up probe's)."""

    groups: list[tuple[int, torch.Tensor]] = field(default_factory=list)
    whole: int = -1  # the adapter of every token of the step, where one has them all (-1: none has)

    def choose(self, adapters: list[int], tokens: list[int]) -> None:
        """adapters: each row's adapter index (-1: the base); tokens: each row's tokens in the step."""
        places: dict[int, list[int]] = {}
        at = 0
        for adapter, count in zip(adapters, tokens, strict=True):
            if adapter >= 0:
                places.setdefault(adapter, []).extend(range(at, at + count))
            at += count
        self.groups = [(adapter, torch.tensor(rows)) for adapter, rows in places.items()]
        only = next(iter(places)) if len(places) == 1 else -1
        self.whole = only if only >= 0 and len(places[only]) == at else -1


class LoraLinear(nn.Module):
    """A Linear layer (any of the engine's) with its adapters' low-rank products beside it."""

    def __init__(self, base: nn.Module, shape: tuple[int, int], products: list[Optional[tuple[nn.Module, nn.Module]]],
                 selection: Selection):
        """shape: the base layer's (inputs, outputs); products: per adapter index, its (x A^T, then
        times s B^T) layers, None where that adapter does not touch this layer."""
        super().__init__()
        self.base, self.selection = base, selection
        self.in_features, self.out_features = shape
        self.touched = [product is not None for product in products]
        self.downs = nn.ModuleList([p[0] if p is not None else nn.Identity() for p in products])
        self.ups = nn.ModuleList([p[1] if p is not None else nn.Identity() for p in products])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        if not self.selection.groups:
            return y
        whole = self.selection.whole
        if whole >= 0:  # every token's: no rows to pick (the same sums, y + delta, as below)
            return y + self.ups[whole](self.downs[whole](x)) if self.touched[whole] else y
        rows, out = x.reshape(-1, self.in_features), y.reshape(-1, self.out_features).clone()
        for adapter, places in self.selection.groups:
            if self.touched[adapter]:
                out[places] += self.ups[adapter](self.downs[adapter](rows[places]))
        return out.reshape(y.shape)


@dataclass(frozen=True)
class Adapter:
    """One adapter as read: each target layer's (A, s B) in fp32."""

    name: str
    path: str
    rank: int
    layers: dict[str, tuple[torch.Tensor, torch.Tensor]]


def read(name: str, path: str, model: nn.Module) -> Adapter:
    """The adapter of the PEFT folder `path` for `model`; ValueError naming it for what cannot be served."""
    folder = Path(path)
    where = f"lora adapter {name!r} ({path})"
    try:
        config = json.loads((folder / "adapter_config.json").read_text())
        weights = load_file(folder / "adapter_model.safetensors")
    except (OSError, ValueError) as exc:
        raise ValueError(f"{where}: not a PEFT adapter folder (adapter_config.json, "
                         f"adapter_model.safetensors): {exc}") from exc
    if config.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"{where}: peft_type {config.get('peft_type')!r}; only LORA adapters are served")
    for key, allowed in (("use_dora", (False, None)), ("bias", ("none", None)), ("modules_to_save", (None, []))):
        if config.get(key) not in allowed:
            raise ValueError(f"{where}: {key} {config.get(key)!r} is not served (only the low-rank products are)")
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in weights.items():
        module, _, part = key.removeprefix(_PREFIX).rpartition(".lora_")
        if not key.startswith(_PREFIX) or part not in ("A.weight", "B.weight"):
            raise ValueError(f"{where}: tensor {key!r} is not a LoRA A or B weight of a Linear layer")
        pairs.setdefault(module, {})[part[0]] = tensor.float()
    layers = {}
    modules = dict(model.named_modules())
    for module, pair in pairs.items():
        layer = modules.get(module)
        if layer is None or not hasattr(layer, "in_features") or set(pair) != {"A", "B"}:
            raise ValueError(f"{where}: {module!r} is no Linear layer of the model, or lacks its A or B")
        down, up = pair["A"], pair["B"]
        rank = down.shape[0]
        if down.shape[1] != layer.in_features or up.shape != (layer.out_features, rank):
            raise ValueError(f"{where}: {module!r} has A {tuple(down.shape)} and B {tuple(up.shape)}, which do not "
                             f"fit its {layer.in_features} inputs and {layer.out_features} outputs")
        short = module.rpartition(".")[2]
        r = config.get("rank_pattern", {}).get(short, config.get("r", rank))
        alpha = config.get("alpha_pattern", {}).get(short, config.get("lora_alpha", r))
        scale = alpha / math.sqrt(r) if config.get("use_rslora") else alpha / r
        layers[module] = (down, up * scale)
    if not layers:
        raise ValueError(f"{where}: it holds no LoRA weights")
    return Adapter(name, path, max(a.shape[0] for a, _ in layers.values()), layers)


@dataclass
class Lora:
    """The adapters a model serves, by name; `selection` is what the model runner sets each step."""

    adapters: list[Adapter]
    selection: Selection

    def index(self, name: Optional[str]) -> int:
        """The adapter's index for a request's adapter name (-1: the base model)."""
        return next((i for i, a in enumerate(self.adapters) if a.name == name), -1)


def attach(model: nn.Module, sources: dict[str, str]) -> Optional[Lora]:
    """Read every adapter and put LoraLinear layers where any of them adds a product; None for none."""
    if not sources:
        return None
    adapters = [read(name, path, model) for name, path in sources.items()]
    selection = Selection()
    targets = sorted({module for adapter in adapters for module in adapter.layers})
    modules = dict(model.named_modules())
    for module in targets:
        products = [_product(*a.layers[module]) if module in a.layers else None for a in adapters]
        down, up = next(a.layers[module] for a in adapters if module in a.layers)
        put(model, module, LoraLinear(modules[module], (down.shape[1], up.shape[0]), products, selection))
    return Lora(adapters, selection)


def _product(down: torch.Tensor, up: torch.Tensor) -> tuple[nn.Module, nn.Module]:
    """The two products in dense_matmul.c (a row's sums whatever the batch), where it is built."""
    if native.fp32_ready():
        return Fp32Linear(down, None), Fp32Linear(up, None)
    first, second = nn.Linear(down.shape[1], down.shape[0], bias=False), nn.Linear(up.shape[1], up.shape[0], bias=False)
    with torch.no_grad():
        first.weight.copy_(down)
        second.weight.copy_(up)
    return first, second
