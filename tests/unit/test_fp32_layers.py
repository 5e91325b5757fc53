"""fp32 models on CPU (fp32.py): their Linear and Conv1D products in dense_matmul.c, a row's bits
whatever the batch; and end to end, log probabilities batched bit for bit as alone."""
import asyncio
import ctypes

import pytest
import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

from contract import EngineConfig, SamplingParams
from engine.kernels import build, native
from engine.model.fp32 import Fp32Linear, install
from engine.model.loader import load_model
from tests.unit.test_batching import mixed_requests

needs_kernel = pytest.mark.skipif(not native.fp32_ready(), reason="dense_matmul.c does not run here")


@needs_kernel
@pytest.mark.parametrize("inputs, outputs", [(64, 256), (576, 1536), (1536, 576), (768, 50)])
def test_a_rows_bits_do_not_depend_on_the_batch(inputs, outputs):
    """Row i of 130 rows, of every prefix of them, and alone: the same bits; close to float64."""
    torch.manual_seed(0)
    linear = nn.Linear(inputs, outputs)
    layer = Fp32Linear(linear.weight.detach(), linear.bias)
    x = torch.randn(130, inputs)
    with torch.no_grad():
        full = layer(x)
        reference = x.double() @ linear.weight.double().t() + linear.bias.double()
    assert full.shape == (130, outputs)
    assert (full.double() - reference).abs().max() <= 1e-5 * reference.abs().max()
    for rows in (1, 2, 3, 15, 16, 17, 64, 129):
        assert torch.equal(layer(x[:rows]), full[:rows]), rows
    assert all(torch.equal(layer(x[i:i + 1]), full[i:i + 1]) for i in (5, 77, 129))


@needs_kernel
def test_weights_that_are_bf16_values_are_kept_as_bf16_with_the_same_numbers():
    """A checkpoint published in bf16 and loaded in fp32: half the bytes, and the fp32 packing's bits."""
    torch.manual_seed(0)
    weight = torch.randn(100, 576).to(torch.bfloat16).float()
    layer, plain = Fp32Linear(weight, None), Fp32Linear(weight + 1e-3, None)
    assert layer.packed.dtype == torch.bfloat16 and plain.packed.dtype == torch.float32
    x = torch.randn(37, 576)
    assert torch.equal(layer(x), native.fp32_matmul(x, layer.packed.float())[:, :100])
    assert torch.equal(layer(x[5:6]), layer(x)[5:6])


@needs_kernel
def test_the_avx2_version_gives_the_same_bits(tmp_path):
    """dense_matmul.c as a CPU without AVX-512 builds it (6 rows a tile, two vectors a group)
    against the engine's build here, fp32 and bf16 weights, every row count around the tiles."""
    build.compile_into(build.find_compiler(), tmp_path / "avx2.so", (build.HERE / "dense_matmul.c",),
                       ("-mno-avx512f",))
    avx2 = build.bind(ctypes.CDLL(str(tmp_path / "avx2.so")), missing_ok=True)
    assert avx2.dense_matmul_ready() == 1
    torch.manual_seed(0)
    x = torch.randn(17, 576)
    for weight in (torch.randn(64, 576), torch.randn(64, 576).to(torch.bfloat16).float()):
        layer = Fp32Linear(weight, None)
        function = "bf16_matmul" if layer.packed.dtype == torch.bfloat16 else "fp32_matmul"
        for rows in (1, 5, 6, 7, 12, 16, 17):
            y = torch.empty(rows, 64)
            assert getattr(avx2, function)(x.data_ptr(), layer.packed.data_ptr(), y.data_ptr(), rows, 576, 64, 2) == 0
            assert torch.equal(y, layer(x[:rows])), (function, rows)


@needs_kernel
def test_linear_and_conv1d_layers_are_swapped_in_fp32_models_only(gpt2_model, llama_model, int4_llama_model):
    for path, kind in ((gpt2_model, Conv1D), (llama_model, nn.Linear)):
        model = unswapped_fp32_model(path)
        x = torch.randn(3, 5, model.config.hidden_size)
        layers = {name: m for name, m in model.named_modules() if type(m) is kind}
        expected = {name: m(x) for name, m in layers.items() if m.weight.shape[-1 if kind is nn.Linear else 0]
                    == x.shape[-1]}
        assert install(model) == len(layers) + (kind is Conv1D)  # GPT-2's lm_head is a Linear
        swapped = dict(model.named_modules())
        assert all(type(swapped[name]) is Fp32Linear for name in layers)
        for name, want in expected.items():
            assert torch.allclose(swapped[name](x), want, atol=1e-5), name
    int4 = load_model(cpu_config(int4_llama_model))
    assert int4.int4 and not any(isinstance(m, Fp32Linear) for m in int4.model.modules())
    bf16 = load_model(cpu_config(llama_model, dtype="bf16")).model
    assert not any(isinstance(m, Fp32Linear) for m in bf16.modules())


def test_without_the_kernels_the_layers_stay_pytorchs(llama_model, monkeypatch):
    monkeypatch.setattr(build, "library", lambda: None)
    model = load_model(cpu_config(llama_model, dtype="fp32")).model
    assert not any(isinstance(m, Fp32Linear) for m in model.modules())
    assert any(type(m) is nn.Linear for m in model.modules())


@needs_kernel
async def test_fp32_log_probabilities_batched_are_bit_for_bit_alone(any_model, make_engine):
    """12 mixed requests with log probabilities and alternatives: the same numbers together as
    alone (PyTorch's fp32 matmul gave other bits beside other rows)."""
    engine = make_engine(any_model, dtype="fp32", max_prefill_tokens=16)
    requests = [(p, SamplingParams(max_tokens=params.max_tokens, ignore_eos=True, logprobs=True, top_logprobs=3))
                for p, params in mixed_requests(12)]

    async def scored(prompt: str, params: SamplingParams) -> tuple[list, list, list]:
        """Token by token (a speculating stream, alone, may get several in one output)."""
        ids, logprobs, alternatives = [], [], []
        async for c in engine.generate(prompt, params):
            ids += c.token_ids
            logprobs += c.logprobs
            alternatives += c.alternatives
        return ids, logprobs, alternatives
    alone = [await scored(p, params) for p, params in requests]
    assert await asyncio.gather(*(scored(p, params) for p, params in requests)) == alone


def cpu_config(path: str, dtype: str = "auto") -> EngineConfig:
    return EngineConfig(model=path, device="cpu", dtype=dtype)


def unswapped_fp32_model(path: str) -> nn.Module:
    """The model as the loader leaves it in fp32, but with transformers' own layers."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("engine.model.loader.fp32_layers", lambda model: 0)
        return load_model(cpu_config(path, dtype="fp32")).model
