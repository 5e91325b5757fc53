"""Q4_K and Q6_K made here (engine/model/k_quants.py) are llama.cpp's blocks byte for byte, and
q4_k_m mixes them as llama.cpp's Q4_K_M preset does (engine/model/quant_mix.py)."""
import asyncio
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from gguf import quants

from contract import EngineConfig
from engine.model import gguf_native, k_quants, quant_mix
from engine.model.int4 import Int4Linear, Int8Linear
from engine.model.loader import load_model
from testing.toy_models import build
from tests.unit.test_batching import collect, mixed_requests
from tests.unit.test_quantize_on_load import _sixteen_bit

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "k_quants_llama_cpp.npz"


@pytest.mark.parametrize("kind", ["q4_k", "q6_k"])
def test_the_blocks_are_llama_quantizes(kind):
    reference = np.load(FIXTURE)
    weights = reference[f"{kind}_weights"].astype(np.float32)
    assert np.array_equal(getattr(k_quants, kind)(weights), reference[f"{kind}_blocks"])


@pytest.mark.parametrize("kind", [T.Q4_K, T.Q6_K])
def test_the_blocks_stand_for_the_weights_and_chunks_change_nothing(kind):
    weights = (np.random.default_rng(1).standard_normal((600, 512)) * 0.05).astype(np.float32)
    weights[3] = 0  # an all-zero row: blocks of zeros
    with quant_mix.workers() as pool:
        blocks = quant_mix.quantize(weights, kind, pool)
    assert np.array_equal(blocks, quant_mix.quantize(weights, kind))  # in chunks on threads: the same bytes
    back = quants.dequantize(blocks, kind)
    error = np.abs(back - weights).max(axis=1) / np.abs(weights).max(axis=1).clip(1e-9)
    assert (error < (0.1 if kind is T.Q4_K else 0.02)).all() and not back[3].any()


def test_q4_k_m_keeps_more_bits_where_llama_cpp_does():
    """The layers whose V and down projections llama.cpp's Q4_K_M file of the 1.17B model keeps in
    Q6_K (16 layers), and Gemma 3 270M's (18 layers: nine of them)."""
    assert [i for i in range(16) if quant_mix.use_more_bits(i, 16)] == [0, 1, 4, 7, 10, 13, 14, 15]
    assert sum(quant_mix.use_more_bits(i, 18) for i in range(18)) == 9


@pytest.mark.skipif(not gguf_native.servable(), reason="the C kernels are not built here")
async def test_a_folder_served_as_q4_k_m(tmp_path_factory, make_engine, monkeypatch):
    """A 4-layer Llama of 256-wide rows: Q4_K layers as int4 with fp32 scales, Q6_K ones, and a
    batch of them decodes as each request alone."""
    monkeypatch.setenv("LLM_QUANT_CACHE", str(tmp_path_factory.mktemp("cache")))
    root = tmp_path_factory.mktemp("medium")
    folder = _sixteen_bit(str(build(root / "fp32", "llama", size="medium")), root / "bf16")
    loaded = load_model(EngineConfig(model=folder, quant="q4_k_m"))
    layers = loaded.model.model.layers
    assert loaded.info.dtype == "q4_k_m"
    assert isinstance(layers[1].mlp.up_proj, Int4Linear) and layers[1].mlp.up_proj.wide  # Q4_K
    for i in range(4):  # of 4 layers, llama.cpp keeps more bits in layers 2 and 3
        down = layers[i].mlp.down_proj
        assert isinstance(down, Int8Linear) and down.sub if i >= 2 else isinstance(down, Int4Linear), i  # Q6_K, Q4_K
    engine = make_engine(folder, quant="q4_k_m", max_prefill_tokens=16)
    requests = mixed_requests(8, seed=2)
    alone = [await collect(engine, p, params) for p, params in requests]
    assert await asyncio.gather(*(collect(engine, p, params) for p, params in requests)) == alone
    assert torch.tensor([len(ids) for ids, _, _ in alone]).min() > 0
