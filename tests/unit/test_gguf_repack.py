"""gguf_repack.c writes a Q4_K, Q6_K, Q4_0, Q4_1, Q5_0 or Q8_0 tensor's blocks straight into the
kernels' layouts: the layer gguf_native.repacked makes holds the very buffers that `keep` makes of
`split` (Python's way), bit for bit, with the file's rows in their order or reordered (Llama's q and k), and on
every kernel path this CPU builds; a shape the kernel does not take is left to Python's way. A
Q4_K or Q6_K kept with its own scales (int4k_matmul's and int8k_matmul's layouts, AVX-512's) holds
the same steps and scales that give `keep`'s fp32 ones exactly, and its products are `keep`'s bit
for bit."""
import ctypes

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from torch import nn

from engine.kernels import gguf_repack
from engine.model import gguf_native
from engine.model.gguf_file import Tensor
from engine.model.gguf_types import split
from engine.model.int4 import Int4Linear
from testing.golden import kernels
from tests.unit.test_gguf_types import OUTPUTS, WIDTH, raw_blocks

INT4, INT8 = ("packed", "scale", "low"), ("weight_int8", "scales", "lows")
BUFFERS = {T.Q4_K: INT4, T.Q6_K: INT8, T.Q4_0: INT4, T.Q4_1: INT4, T.Q5_0: INT8, T.Q8_0: INT8}
K_QUANTS = (T.Q4_K, T.Q6_K)


@pytest.fixture(scope="module", autouse=True)
def _built() -> None:
    if not gguf_native.servable():
        pytest.skip("the C kernels are not built here: GGUF blocks are not kept as layers")


class Holder(nn.Module):
    def __init__(self, outputs: int = OUTPUTS, width: int = WIDTH) -> None:
        super().__init__()
        self.proj = nn.Linear(width, outputs, bias=False)


def both_ways(qtype: T, data: np.ndarray, order: np.ndarray) -> tuple[nn.Module, nn.Module]:
    """(the layer repacked, the layer kept from `split`) of one tensor."""
    repacked, kept = Holder(), Holder()
    assert WIDTH % 256 == 0 and OUTPUTS % 16 == 0
    assert gguf_native.repacked(repacked, "proj.weight", Tensor("blk.0.ffn_down.weight", qtype, WIDTH, data), order)
    assert gguf_native.keep(kept, "proj.weight", split(data, qtype, WIDTH), order)
    return repacked.proj, kept.proj


def own_scales_as_fp32(layer: nn.Module) -> tuple[torch.Tensor, ...]:
    """A layer's own scales as the fp32 scale (and low) they stand for, each product in fp32 (exact):
    a Q4_K's fp16 d and -dmin per 256 by its u8 sc and m per 32; a Q6_K's fp16 d per 256 by its int8
    sc per 16."""
    if isinstance(layer, Int4Linear):
        values = layer.scale.float().repeat_interleave(8, dim=1) * layer.low.float()  # [groups, blocks, 2, 16]
        return values[:, :, 0].contiguous(), values[:, :, 1].contiguous()
    return (layer.scales.float().repeat_interleave(16, dim=1) * layer.lows.float(),)


@pytest.mark.parametrize("qtype", list(BUFFERS), ids=lambda t: t.name)
@pytest.mark.parametrize("reordered", [False, True], ids=["in order", "reordered"])
def test_the_repacked_layer_holds_the_buffers_of_split_and_keep(qtype: T, reordered: bool,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gguf_native.native, "own_k_scales", lambda: False)
    data = raw_blocks(qtype, seed=int(qtype) + 7)
    order = np.random.default_rng(1).permutation(OUTPUTS) if reordered else np.arange(OUTPUTS)
    repacked, kept = both_ways(qtype, data, order)
    assert type(repacked) is type(kept)
    for name in BUFFERS[qtype]:
        mine, theirs = getattr(repacked, name), getattr(kept, name)
        if theirs is None:
            assert mine is None, name
            continue
        assert mine.dtype == theirs.dtype and mine.shape == theirs.shape, name
        assert torch.equal(mine.view(torch.uint8), theirs.contiguous().view(torch.uint8)), f"{qtype.name}: {name}"
    x = torch.randn(3, WIDTH)
    assert torch.equal(repacked(x), kept(x))


@pytest.mark.parametrize("qtype", K_QUANTS, ids=lambda t: t.name)
@pytest.mark.parametrize("reordered", [False, True], ids=["in order", "reordered"])
def test_a_k_quant_kept_with_its_own_scales_stands_for_the_same_values_and_products(
        qtype: T, reordered: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gguf_native.native, "own_k_scales", lambda: True)
    data = raw_blocks(qtype, seed=int(qtype) + 19)
    order = np.random.default_rng(2).permutation(OUTPUTS) if reordered else np.arange(OUTPUTS)
    own, kept = both_ways(qtype, data, order)
    assert own.own_scales and not kept.own_scales
    steps, *scales = BUFFERS[qtype]
    assert torch.equal(getattr(own, steps), getattr(kept, steps))
    assert sum(getattr(own, name).nbytes for name in scales) < sum(
        getattr(kept, name).nbytes for name in scales if getattr(kept, name) is not None) / 3
    theirs = [getattr(kept, name) for name in scales if getattr(kept, name) is not None]
    assert all(torch.equal(a, b) for a, b in zip(own_scales_as_fp32(own), theirs, strict=True))
    for rows in (1, 3, 8, 17, 40):  # every tile's count, and AVX2's widened groups
        x = torch.randn(rows, WIDTH, generator=torch.Generator().manual_seed(rows))
        assert torch.equal(own(x), kept(x)), f"{rows} rows"


@pytest.mark.parametrize("qtype", list(BUFFERS), ids=lambda t: t.name)
def test_every_kernel_path_repacks_the_same_bytes(qtype: T, kernel_libraries: dict[str, ctypes.CDLL]) -> None:
    if len(kernel_libraries) < 2:
        pytest.skip("this CPU builds one kernel path only")
    data = raw_blocks(qtype, seed=int(qtype) + 11)
    order = np.arange(OUTPUTS)[::-1].copy()
    made = {}
    for path, library in kernel_libraries.items():
        with kernels(library):
            made[path] = (*gguf_repack.repack(qtype.name, data, order, OUTPUTS, WIDTH),
                          *gguf_repack.repack(qtype.name, data, order, OUTPUTS, WIDTH, own_scales=True))
    first, *others = made.values()
    assert first is not None
    for other in others:
        assert other is not None and all(torch.equal(a, b) for a, b in zip(first, other, strict=True))


def test_a_shape_the_kernel_does_not_take_is_split_instead() -> None:
    """Rows not a multiple of 16: repacked declines (the caller splits and keeps, as before)."""
    data = raw_blocks(T.Q4_K, seed=3)[:40]
    holder = Holder(outputs=40)
    tensor = Tensor("blk.0.ffn_down.weight", T.Q4_K, WIDTH, data)
    assert gguf_repack.repack("Q4_K", data, None, 40, WIDTH) is None
    assert not gguf_native.repacked(holder, "proj.weight", tensor, np.arange(40))
    assert type(holder.proj) is nn.Linear
