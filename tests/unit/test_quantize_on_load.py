"""A Hugging Face folder of 16-bit weights is quantized at load into GGML blocks (quant, LLM_QUANT),
served by the same layers as a GGUF's, and kept for the next start."""
import asyncio
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from contract import EngineConfig, ValidationError
from engine.kernels import native
from engine.model import gguf_native
from engine.model.gguf_embedding import BlockRows
from engine.model.int4 import Int4Linear, Int8Linear
from engine.model.loader import load_model
from testing.toy_models import build
from tests.unit.test_batching import collect, mixed_requests

pytestmark = pytest.mark.skipif(not gguf_native.servable(), reason="the C kernels are not built here")


def _sixteen_bit(source: str, out: Path, dtype: torch.dtype = torch.bfloat16) -> str:
    """The same model written as a folder of `dtype` weights, as Hugging Face publishes them."""
    if not out.exists():
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).to(dtype)
        model.save_pretrained(out)
        AutoTokenizer.from_pretrained(source).save_pretrained(out)
    return str(out)


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("LLM_QUANT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def bf16_llama(llama_model, tmp_path_factory) -> str:
    return _sixteen_bit(llama_model, tmp_path_factory.mktemp("bf16") / "llama")


@pytest.fixture(scope="module")
def bf16_architecture(tmp_path_factory):
    """A folder of bf16 weights of one of the architectures whose vocabulary comes in whole groups
    of 16 (toy_models.ARCHITECTURES), by name."""
    made: dict[str, str] = {}

    def folder(style: str) -> str:
        if style not in made:
            fp32 = build(tmp_path_factory.mktemp(style) / "fp32", style)
            made[style] = _sixteen_bit(str(fp32), fp32.parent / "bf16")
        return made[style]
    return folder


def _forward(loaded, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return loaded.model(torch.tensor([ids])).logits[0]


def test_a_16_bit_folder_runs_as_q8_0_blocks_the_ggml_quantizer_makes(bf16_llama, cache):
    loaded = load_model(EngineConfig(model=bf16_llama).validate())
    assert loaded.info.dtype == "q8_0" and loaded.int4
    layers = {n: m for n, m in loaded.model.named_modules() if isinstance(m, Int8Linear)}
    assert len(layers) == 2 * 7  # each layer's q, k, v, o, gate, up, down
    # the output layer too where its outputs come in whole groups of 16 (this vocabulary's do not)
    vocab = loaded.model.config.vocab_size
    assert isinstance(loaded.model.lm_head, Int8Linear) == (vocab % native.DENSE_CHANNELS == 0)
    assert isinstance(loaded.model.get_input_embeddings(), BlockRows)
    # one layer's steps and scales are the gguf package's Q8_0 blocks of the folder's weights
    weights = load_file(next(Path(bf16_llama).glob("*.safetensors")))
    name = "model.layers.1.mlp.down_proj"
    blocks = quants.quantize(weights[f"{name}.weight"].float().numpy(), GGMLQuantizationType.Q8_0)
    layer = layers[name]
    rows, width = layer.out_features, layer.in_features
    steps = layer.weight_int8.view(rows // native.DENSE_CHANNELS, width, native.DENSE_CHANNELS).transpose(1, 2)
    expected = blocks.reshape(rows, -1, 34)
    assert np.array_equal(steps.reshape(rows, -1, 32).numpy(), expected[..., 2:].view(np.int8))
    scales = layer.scales.view(rows // native.DENSE_CHANNELS, -1, native.DENSE_CHANNELS).transpose(1, 2)
    assert np.array_equal(scales.reshape(rows, -1).numpy(), expected[..., :2].copy().view(np.float16)[..., 0])


def test_the_second_start_reads_the_cache_and_computes_the_same_bits(bf16_llama, cache, caplog):
    ids = [3, 17, 42, 9, 28, 5]
    with caplog.at_level(logging.INFO, logger="engine.model"):
        first = load_model(EngineConfig(model=bf16_llama))
    assert "quantized to q8_0" in caplog.text and "read from the cache" not in caplog.text
    assert len(list(cache.iterdir())) == 2  # one entry and the files' hashes
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="engine.model"):
        second = load_model(EngineConfig(model=bf16_llama))
    assert "read from the cache" in caplog.text and "quantized to" not in caplog.text
    assert torch.equal(_forward(first, ids), _forward(second, ids))
    assert first.parameters == second.parameters == sum(p.numel() for p in
                                                        AutoModelForCausalLM.from_pretrained(bf16_llama).parameters())


def test_a_changed_folder_is_quantized_again(llama_model, cache, tmp_path):
    folder = Path(_sixteen_bit(llama_model, tmp_path / "m", torch.float16))
    load_model(EngineConfig(model=str(folder)))
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float16)
    with torch.no_grad():
        model.lm_head.weight.mul_(2)
    model.save_pretrained(folder)
    load_model(EngineConfig(model=str(folder)))
    assert len([p for p in cache.iterdir() if p.is_dir()]) == 2


def test_q4_0_keeps_the_output_layer_in_q8_0(bf16_architecture, cache):
    loaded = load_model(EngineConfig(model=bf16_architecture("qwen2"), quant="q4_0"))
    assert loaded.info.dtype == "q4_0"
    assert isinstance(loaded.model.model.layers[0].mlp.up_proj, Int4Linear)
    assert isinstance(loaded.model.lm_head, Int8Linear) and not loaded.model.lm_head.sub  # fp16 scales per 32


def test_a_tied_output_layer_runs_from_the_embeddings_blocks(bf16_architecture, cache):
    """Gemma 3 ties its output layer to its embeddings: one tensor of blocks serves both, from the
    folder and from the cache alike."""
    folder = bf16_architecture("gemma3_text")
    first, second = load_model(EngineConfig(model=folder)), load_model(EngineConfig(model=folder))
    for loaded in (first, second):
        embedding, head = loaded.model.get_input_embeddings(), loaded.model.lm_head
        assert isinstance(embedding, BlockRows) and isinstance(head, Int8Linear)
        rows = head.weight_int8.view(-1, head.in_features, native.DENSE_CHANNELS).transpose(1, 2)
        assert torch.equal(rows.reshape(head.out_features, -1), embedding.steps)
    ids = [3, 17, 42, 9, 28, 5]
    assert torch.equal(_forward(first, ids), _forward(second, ids))


def test_an_fp32_folder_stays_fp32_unless_asked(llama_model, bf16_llama, cache):
    assert load_model(EngineConfig(model=llama_model)).info.dtype == "float32"
    assert load_model(EngineConfig(model=llama_model, quant="q8_0")).info.dtype == "q8_0"
    assert load_model(EngineConfig(model=bf16_llama, quant="none")).info.dtype == "float32"  # as before


@pytest.mark.parametrize("kw, says", [
    ({"quant": "q3_k_s"}, "must be one of auto, none, q8_0, q4_k_m"),
    ({"quant": "q8_0", "dtype": "fp32"}, "does not go with dtype fp32"),
    ({"quant": "q8_0", "device": "meta"}, "CPU only"),
])
def test_a_quant_that_cannot_be_served_is_refused_naming_the_field(bf16_llama, kw, says):
    with pytest.raises(ValidationError) as err:
        load_model(EngineConfig(model=bf16_llama, **kw).validate())
    assert err.value.field == "quant" and says in str(err.value)


def test_quant_comes_from_the_environment():
    assert EngineConfig.from_env({"LLM_QUANT": "q4_0"}) == {"quant": "q4_0"}
    with pytest.raises(ValidationError) as err:
        EngineConfig.from_env({"LLM_QUANT": "int3"})
    assert err.value.field == "LLM_QUANT"


async def test_a_quantized_folder_decodes_the_same_alone_and_batched(make_engine, bf16_llama, cache):
    engine = make_engine(bf16_llama, max_prefill_tokens=16)
    assert engine.info.dtype == "q8_0"
    for sample in (False, True):
        requests = mixed_requests(12, seed=3, sample=sample)
        alone = [await collect(engine, p, params) for p, params in requests]
        assert await asyncio.gather(*(collect(engine, p, params) for p, params in requests)) == alone
