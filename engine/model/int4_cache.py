"""A folder's int4 layers as its last load found them, kept for the next load (quant_cache.py).

A folder whose weights already are 4-bit in groups of 32 (the default model's, made from its Q4_1
GGUF) is served as int4 by default, and each load finds that out anew: int4.swaps rounds every
layer's weights to 4-bit steps and checks that they come back exactly, then the output layer's to
Q8_0. That took 0.7 s of the default model's 1.6 s load, at every start and at every reload after
a keep-alive unload. What it finds depends on the folder's weights alone, so it is kept in the
quant cache under the hash of the folder's weight files and config (a changed file is another
entry, never a stale one), and the next load builds the same layers from it: the same steps,
scales and lows, so the same bits. A folder that is not 4-bit keeps no entry, and is checked
again at each load (it fails at its first layer, in milliseconds).
"""
import logging
import time
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from torch import nn

from . import quant_cache
from .int4 import Swap, swap_in, swaps
from .quant_cache import Stored

log = logging.getLogger(__name__)

SCHEME = "int4-exact 1"  # the entries' kind and this layout's version, in their key
_STEPS, _SCALE, _LOW = ".steps", ".scale", ".low"


def quantize_exact(model: nn.Module, folder: str) -> bool:
    """int4.quantize(model, only_if_exact=True) for the model loaded from `folder`, read from the
    cache where an earlier load kept what it found, else found now and kept."""
    files = quant_cache.weight_files(Path(folder))
    cache = quant_cache.root()
    if cache is None or not files:
        return _swapped(model, swaps(model, only_if_exact=True))
    name = quant_cache.key(Path(folder), files, SCHEME, cache)
    index = quant_cache.entry(cache, name)
    if index is not None:
        started = time.perf_counter()
        kept = _read(index)
        log.info("%s: its int4 layers read from the cache (%s) in %.2f s", Path(folder).name, index["folder"],
                  time.perf_counter() - started)
        return _swapped(model, kept)
    found = swaps(model, only_if_exact=True)
    if found is not None:
        _keep(cache, name, found, folder)
    return _swapped(model, found)


def _swapped(model: nn.Module, found: Optional[list[Swap]]) -> bool:
    if found is None:
        return False
    swap_in(model, found)
    return True


def _keep(cache: Path, name: str, found: list[Swap], folder: str) -> None:
    """The layers as an entry of the cache; where it cannot be written, the next load finds them again."""
    writer = None
    try:
        writer = quant_cache.Writer(cache, name, {"source": str(Path(folder).resolve()), "scheme": SCHEME})
        for swap in found:
            int4 = swap.low is not None
            writer.add(Stored(swap.name + _STEPS, "int4" if int4 else "int8",
                              swap.steps.numpy().astype(np.uint8 if int4 else np.int8, copy=False)))
            writer.add(Stored(swap.name + _SCALE, "F16", swap.scale.numpy().astype(np.float16, copy=False)))
            if swap.low is not None:
                writer.add(Stored(swap.name + _LOW, "F16", swap.low.numpy().astype(np.float16, copy=False)))
        writer.commit()
    except OSError as exc:
        if writer is not None:
            writer.discard()
        log.info("the int4 layers of %s are not kept (%s): the next load finds them again", folder, exc)


def _read(index: dict) -> list[Swap]:
    """The entry's layers, copied out of its file (the model owns its memory, as a load's); the int4
    layers' scales and lows as fp32 holding fp16 values, as int4.swaps gives them."""
    tensors = {stored.name: torch.from_numpy(np.array(stored.data)) for stored in quant_cache.read(index)}
    found = []
    for name in (key[:-len(_STEPS)] for key in tensors if key.endswith(_STEPS)):
        low = tensors.get(name + _LOW)
        scale = tensors[name + _SCALE] if low is None else tensors[name + _SCALE].float()
        found.append(Swap(name, tensors[name + _STEPS], scale, None if low is None else low.float()))
    return found
