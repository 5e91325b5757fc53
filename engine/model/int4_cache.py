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

An entry holds the layers' buffers in the C kernels' own layout (int4's packed pairs, Q8_0's steps
by groups of 16 outputs), which the next load adopts as they are: packing them again from plain
steps took 0.08 s of the default model's 0.4 s load. An output layer the C kernel does not take (its
outputs not a multiple of 16) is named in the entry and made again from its weight, as `swap_in`
makes it. Where the kernels are not built, nothing is kept, and each load finds the layers anew
(PyTorch's int4 kernel takes another layout).
"""
import logging
import time
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from torch import nn

from ..kernels.table import Op, choose
from . import quant_cache
from .int4 import Int4Linear, Int8Linear, swap_in, swaps
from .placement import put
from .quant_cache import Stored

log = logging.getLogger(__name__)

SCHEME = "int4-exact 2"  # the entries' kind and this layout's version, in their key
BUFFERS = {Int4Linear: ("packed", "scale", "low"), Int8Linear: ("weight_int8", "scales")}  # kept, in the kernels' layout


def quantize_exact(model: nn.Module, folder: str) -> bool:
    """int4.quantize(model, only_if_exact=True) for the model loaded from `folder`, read from the
    cache where an earlier load kept what it found, else found now and kept."""
    files = quant_cache.weight_files(Path(folder))
    cache = quant_cache.root()
    if cache is None or not files or not (choose(Op.INT4_MATMUL, "int4").c and choose(Op.INT8_MATMUL, "int8").c):
        return _found(model, folder, None)  # no entry to adopt where the kernels that read its layout are not built
    name = quant_cache.key(Path(folder), files, SCHEME, cache)
    index = quant_cache.entry(cache, name)
    if index is not None:
        started = time.perf_counter()
        _adopt(model, index)
        log.info("%s: its int4 layers read from the cache (%s) in %.2f s", Path(folder).name, index["folder"],
                 time.perf_counter() - started)
        return True
    return _found(model, folder, (cache, name))


def _found(model: nn.Module, folder: str, keep: Optional[tuple[Path, str]]) -> bool:
    """The layers found now and swapped in; kept under `keep` (cache, entry name) where every int4
    one is the C kernels' (their layout is what an entry holds)."""
    found = swaps(model, only_if_exact=True)
    if found is None:
        return False
    swap_in(model, found)
    layers = {swap.name: model.get_submodule(swap.name) for swap in found}
    if keep is not None and all(layer.c_kernel for layer in layers.values() if isinstance(layer, Int4Linear)):
        _keep(*keep, layers, folder)
    return True


def _keep(cache: Path, name: str, layers: dict[str, nn.Module], folder: str) -> None:
    """The layers' buffers as an entry of the cache; where it cannot be written, the next load finds them again."""
    writer = None
    try:
        rebuilt = [layer_name for layer_name, layer in layers.items() if not layer.c_kernel]
        writer = quant_cache.Writer(cache, name, {"source": str(Path(folder).resolve()), "scheme": SCHEME,
                                                  "rebuilt": rebuilt})
        for layer_name, layer in layers.items():
            if layer_name in rebuilt:
                continue
            for buffer in BUFFERS[type(layer)]:
                values = getattr(layer, buffer)
                writer.add(Stored(f"{layer_name}.{buffer}", type(layer).__name__, values.numpy()))
        writer.commit()
    except OSError as exc:
        if writer is not None:
            writer.discard()
        log.info("the int4 layers of %s are not kept (%s): the next load finds them again", folder, exc)


def _adopt(model: nn.Module, index: dict) -> None:
    """The entry's layers in place of the model's Linear layers, their buffers copied out of its
    file (the model owns its memory, as a load's)."""
    tensors: dict[str, dict[str, torch.Tensor]] = {}
    kinds: dict[str, str] = {}
    for stored in quant_cache.read(index):
        layer_name, _, buffer = stored.name.rpartition(".")
        tensors.setdefault(layer_name, {})[buffer] = torch.from_numpy(np.array(stored.data))
        kinds[layer_name] = stored.kind
    for layer_name, buffers in tensors.items():
        linear = model.get_submodule(layer_name)
        assert isinstance(linear, nn.Linear), layer_name
        kind = Int4Linear if kinds[layer_name] == Int4Linear.__name__ else Int8Linear
        put(model, layer_name, kind.of_packed(linear, *(buffers[b] for b in BUFFERS[kind])))
    for layer_name in index["meta"]["rebuilt"]:
        linear = model.get_submodule(layer_name)
        assert isinstance(linear, nn.Linear), layer_name
        put(model, layer_name, Int8Linear(linear))
