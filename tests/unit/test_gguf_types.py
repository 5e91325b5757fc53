"""gguf_types.py keeps each llama.cpp quant type's blocks exactly, and quant_matmul.c multiplies
them: these tests hold both to the `gguf` package, the reference for what a GGUF's bytes mean.

For every served type, a [48, 512] tensor is written to a real GGUF file and read back; then
- `split`'s steps, scales and lows give back the package's dequantization bit for bit;
- the layer `gguf_native.keep` makes of them computes x W^T within fp32's rounding bound of
  float64 on the activations as the kernel rounds them (`int4.int16_blocks`);
- a row alone comes out with the same bits as in a batch, and every kernel path this CPU builds
  (testing/golden.py's: the machine's own, AVX2, plain C) gives the same bits.
"""
import ctypes
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from torch import nn

from engine.model import gguf_native
from engine.model.gguf_types import TYPES, Exact, Layout, split, weights
from engine.model.int4 import Int4Linear, Int8Linear, int16_blocks
from testing.golden import kernels
from tests.unit.test_kernel_paths import activations, same_on_every_path

OUTPUTS, WIDTH, ROWS = 48, 512, 5
# each type's steps as the file holds them (after the type's own offset: Q4_0's -8 is in its low)
STEP_RANGE: dict[T, tuple[int, int]] = {
    T.Q4_0: (0, 15), T.Q4_1: (0, 15), T.Q4_K: (0, 15), T.Q8_0: (-128, 127), T.Q5_0: (-16, 15),
    T.Q5_1: (0, 31), T.Q5_K: (0, 31), T.Q6_K: (-32, 31)}
# where a K type's fp16 super-block scales sit in its block: (d, dmin) or (d,)
K_SCALES: dict[T, tuple[int, ...]] = {T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,)}


@pytest.fixture(scope="module", autouse=True)
def _built() -> None:
    if not gguf_native.servable():
        pytest.skip("the C kernels are not built here: GGUF blocks are not kept as layers")


def raw_blocks(qtype: T, seed: int) -> np.ndarray:
    """[OUTPUTS, bytes per row] blocks: the package's quantization of random weights where it
    quantizes the type, else random bytes with small finite fp16 super-block scales (K types)."""
    rng = np.random.default_rng(seed)
    if qtype not in K_SCALES:
        return gguf.quants.quantize(rng.standard_normal((OUTPUTS, WIDTH), dtype=np.float32) * 0.05, qtype)
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, (OUTPUTS * WIDTH // block, size), dtype=np.uint8)
    for at in K_SCALES[qtype]:
        blocks[:, at:at + 2] = rng.uniform(1e-4, 2e-3, (len(blocks), 1)).astype(np.float16).view(np.uint8)
    return blocks.reshape(OUTPUTS, -1)


@pytest.fixture(scope="module", params=list(TYPES), ids=lambda t: t.name)
def tensor(request, tmp_path_factory) -> tuple[T, np.ndarray]:
    """(type, raw blocks) as a GGUF file written by the package holds them, read back."""
    qtype: T = request.param
    raw = raw_blocks(qtype, seed=int(qtype))
    path: Path = tmp_path_factory.mktemp("gguf") / f"{qtype.name}.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_tensor("blk.0.ffn_down.weight", raw, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    [read] = gguf.GGUFReader(path).tensors
    assert read.tensor_type == qtype and list(read.shape) == [WIDTH, OUTPUTS]
    assert np.array_equal(read.data, raw)
    return qtype, read.data


def reference(qtype: T, data: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(gguf.dequantize(data, qtype).reshape(OUTPUTS, WIDTH).astype(np.float32))


class Holder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(WIDTH, OUTPUTS, bias=False)


def layer(exact: Exact) -> nn.Module:
    """The layer gguf_native makes of `exact` (made anew under each kernel path's library)."""
    holder = Holder()
    assert gguf_native.keep(holder, "proj.weight", exact, None)  # type: ignore[arg-type]
    return holder.proj


def per_input(values: np.ndarray, sub: int) -> torch.Tensor:
    """|values| per sub-block [outputs, width // sub] as [outputs, width], float64."""
    return torch.from_numpy(values).double().abs().repeat_interleave(sub, dim=1)


def test_split_gives_back_the_packages_weights(tensor: tuple[T, np.ndarray]) -> None:
    qtype, data = tensor
    exact = split(data, qtype, WIDTH)
    assert exact.layout is TYPES[qtype].layout and exact.steps.shape == (OUTPUTS, WIDTH)
    assert exact.scale.shape == (OUTPUTS, WIDTH // exact.sub)
    lo, hi = STEP_RANGE[qtype]
    steps = exact.steps.astype(np.int64)
    assert lo <= steps.min() and steps.max() <= hi, f"{qtype.name} steps {steps.min()}..{steps.max()}"
    assert len(np.unique(steps)) > (hi - lo) // 2  # the bits are unpacked, not a constant
    got, want = weights(exact), reference(qtype, data)
    assert torch.equal(got, want), f"{qtype.name}: max |diff| {(got - want).abs().max().item()}"


def test_layer_is_float64_on_the_kernels_activations(tensor: tuple[T, np.ndarray]) -> None:
    """y against int16_blocks(x) @ W^T in float64. The kernel's integer sums are exact; each of
    its `terms` per output (a block's d dx (q . qx), and dx sum(qx) m where there are lows) is
    rounded at most 3 times in fp32 and added once, and the package's fp32 w = d q + m is itself
    rounded once, so |error| <= (terms + 4) 2^-24 sum_i |qx_i| (|d q_i| + |m|): the rigorous
    first-order bound, 1.2e-6 to 4e-6 of that magnitude here (a wrong scale or step is far beyond it)."""
    qtype, data = tensor
    exact = split(data, qtype, WIDTH)
    proj = layer(exact)
    if exact.layout in (Layout.INT4, Layout.INT4_F32):
        assert isinstance(proj, Int4Linear) and proj.wide == (exact.layout is Layout.INT4_F32)
    else:
        assert isinstance(proj, Int8Linear) and proj.sub == (exact.layout is Layout.INT8_SUB)
    x = activations(ROWS, WIDTH)
    y = proj(x).double()
    xq = int16_blocks(x)
    want = xq @ reference(qtype, data).double().T
    size = per_input(exact.scale, exact.sub) * torch.from_numpy(exact.steps).double().abs()
    if exact.low is not None:
        size += per_input(exact.low, exact.sub)
    terms = WIDTH // exact.sub * (1 if exact.low is None else 2)
    bound = (terms + 4) * 2.0 ** -24 * (xq.abs() @ size.T)
    error = (y - want).abs()
    worst = int((error / bound).argmax())
    assert (error <= bound).all(), (
        f"{qtype.name}: |y - float64| {error.flatten()[worst].item():.3g} > bound {bound.flatten()[worst].item():.3g} "
        f"at (row, output) {divmod(worst, OUTPUTS)}; largest error {error.max().item():.3g}")


def test_a_row_alone_is_its_batched_bits(tensor: tuple[T, np.ndarray]) -> None:
    qtype, data = tensor
    proj = layer(split(data, qtype, WIDTH))
    x = activations(ROWS, WIDTH)
    batched = proj(x)
    for row in range(ROWS):
        assert torch.equal(proj(x[row:row + 1])[0], batched[row]), f"{qtype.name}: row {row} alone differs"


def test_every_kernel_path_gives_the_same_bits(tensor: tuple[T, np.ndarray],
                                               kernel_libraries: dict[str, ctypes.CDLL]) -> None:
    if len(kernel_libraries) < 2:
        pytest.skip("this CPU builds one kernel path only")
    qtype, data = tensor
    exact = split(data, qtype, WIDTH)
    x = activations(ROWS, WIDTH)

    def run(library: ctypes.CDLL) -> list[torch.Tensor]:
        with kernels(library):
            proj = layer(exact)
            return [proj(x), proj(x[2:3])]
    same_on_every_path(kernel_libraries, run)


def test_an_embedding_kept_as_blocks_looks_up_the_tables_rows(tensor: tuple[T, np.ndarray]) -> None:
    """gguf_embedding.py: the rows looked up from the blocks are the fp32 table's bit for bit, in a
    plain embedding, and in Gemma's scaled one as transformers' module computes them from that table."""
    from transformers.models.gemma3.modeling_gemma3 import Gemma3TextScaledWordEmbedding

    from engine.model.gguf_embedding import BlockRows
    qtype, data = tensor
    exact = split(data, qtype, WIDTH)
    table = weights(exact)
    ids = torch.tensor([[3, 0, OUTPUTS - 1], [5, 5, 1]])
    plain = BlockRows(nn.Embedding(OUTPUTS, WIDTH), exact, None)
    assert torch.equal(plain(ids), table[ids]) and plain.weight.numel() == 0
    order = torch.arange(OUTPUTS).flip(0)
    reference = Gemma3TextScaledWordEmbedding(OUTPUTS, WIDTH, 0, embed_scale=WIDTH ** 0.5)
    with torch.no_grad():
        reference.weight.copy_(table[order])
    scaled = BlockRows(reference, exact, order)
    assert torch.equal(scaled(ids), reference(ids))
    assert torch.equal(scaled(ids), table[order][ids] * torch.tensor(WIDTH ** 0.5))


def test_the_integer_unpacking_gives_the_packages_steps(tensor: tuple[T, np.ndarray], monkeypatch) -> None:
    """Where a type's steps are unpacked in integers, they are those of the package's own
    dequantization of the blocks with unit scales (the path every other type takes)."""
    from engine.model import gguf_types
    qtype, data = tensor
    fast = split(data, qtype, WIDTH)
    monkeypatch.setattr(gguf_types, "_unpacked", lambda qtype, blocks: None)
    slow = split(data, qtype, WIDTH)
    assert fast.steps.dtype == slow.steps.dtype and np.array_equal(fast.steps, slow.steps)


@pytest.mark.parametrize("width", [32, 96])
def test_q8_0_steps_are_a_copy_of_the_files_bytes_made_once(width: int) -> None:
    """Rows of one block are a view of the file's bytes until copied; rows of several were copied by
    the reshape that joins their blocks. Either way the steps own their memory (the file is mapped)."""
    rng = np.random.default_rng(3)
    data = gguf.quants.quantize(rng.standard_normal((16, width), dtype=np.float32), T.Q8_0)
    exact = split(data, T.Q8_0, width)
    assert not np.shares_memory(exact.steps, data)
    assert np.array_equal(exact.steps, data.reshape(-1, 34)[:, 2:].view(np.int8).reshape(16, width))
