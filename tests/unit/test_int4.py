"""int4 weights on CPU: the kernels' row invariance that batched == alone rests on, the
choice `auto` makes, refusals that name the field, and batched == alone end to end."""
import asyncio

import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer

from contract import EngineConfig, SamplingParams
from engine.kernels import build, llama_layer, native
from engine.model import loader, paged_attention
from engine.model.int4 import Int4Linear, Int8Linear, _quantize, dequantize, int16_blocks, q8_0, quantize
from engine.model.loader import load_model, pick_dtype
from testing import native_reference
from tests.unit.test_batching import collect, mixed_requests


def _int4(linear: nn.Linear, kernel: str = "c") -> Int4Linear:
    """kernel: "c" (quant_matmul.c, where it runs here) or "pytorch" (as without a compiler)."""
    steps, scale, low, _ = _quantize(linear.weight.detach().float())
    if kernel == "c":
        if not native.int4_ready():
            pytest.skip("quant_matmul.c does not run here (no compiler)")
        layer = Int4Linear(linear, steps, scale, low)
    else:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(build, "library", lambda: None)
            layer = Int4Linear(linear, steps, scale, low)
    assert layer.c_kernel == (kernel == "c")
    return layer


def _int8(linear: nn.Linear, kernel: str = "c") -> Int8Linear:
    """The output layer's int8: quant_matmul.c, or PyTorch's kernel as without a compiler."""
    if kernel == "c" and not native.int8_ready():
        pytest.skip("quant_matmul.c does not run here (no compiler)")
    with pytest.MonkeyPatch.context() as patch:
        if kernel != "c":
            patch.setattr(build, "library", lambda: None)
        layer = Int8Linear(linear)
    assert layer.c_kernel == (kernel == "c")
    return layer


@pytest.mark.parametrize("kernel", ["c", "pytorch"])
@pytest.mark.parametrize("shape", [(576, 1536), (1536, 576), (64, 192), (576, 4096)])
def test_each_row_comes_out_the_same_whatever_the_batch(shape, kernel):
    torch.manual_seed(0)
    linear = nn.Linear(*shape)
    layers = {"int4": _int4(linear, kernel), "int8": _int8(linear, kernel)}
    x = torch.randn(64, shape[0])
    for name, layer in layers.items():
        alone = torch.cat([layer(x[i:i + 1]) for i in range(64)])
        for rows in (2, 3, 7, 16, 33, 64):
            assert torch.equal(layer(x[:rows]), alone[:rows]), (name, rows)


def test_weights_on_the_4bit_grid_are_kept_exactly():
    torch.manual_seed(0)
    linear = nn.Linear(128, 96)
    steps, scale, low, exact = _quantize(linear.weight.detach())
    assert not exact  # random weights are not 4-bit
    grid = dequantize(steps, scale, low)
    assert _quantize(grid)[3]  # but their 4-bit version is, and quantizes to itself
    linear.weight.data = grid
    x = torch.randn(5, 128)
    ref = linear(x)
    for kernel in ("c", "pytorch"):
        err = (_int4(linear, kernel)(x) - ref).abs().max() / ref.abs().max()
        assert err < 0.01, kernel  # rounded activations (and with PyTorch's kernel, bf16 scales)


@pytest.mark.parametrize("shape", [(576, 1536), (1536, 576), (192, 576)])
def test_the_c_kernel_is_exact_but_for_its_rounded_activations(shape):
    """Against float64 on the activations as each kernel rounds them (the C kernel: to int16 per
    block; PyTorch's: to bf16): the C kernel's error is fp32 rounding; PyTorch's kernel also
    rounds its scales and output to bf16, and errs a hundred times more."""
    torch.manual_seed(0)
    linear = nn.Linear(*shape, bias=False)
    x = torch.randn(16, shape[0])
    x[3, :32] = 0  # a block of zeros (scale 0)
    x[4, 40] = 300.0  # an outlier that flattens its block
    c, pytorch = _int4(linear, "c"), _int4(linear, "pytorch")
    steps, scale, low, _ = _quantize(linear.weight.detach())
    weight = dequantize(steps, scale, low, torch.float64)
    bf16 = x.to(torch.bfloat16).double()
    c_err = (c(x).double() - int16_blocks(x) @ weight.t()).abs().max().item()
    pytorch_err = (pytorch(x).double() - bf16 @ weight.t()).abs().max().item()
    assert c_err < 2e-5 and c_err * 100 < pytorch_err


def test_int16_blocks_round_to_nearest_even_steps_of_the_blocks_largest():
    x = torch.tensor([[0.5, -1.0, 1.0, 0.75, 2.0] + [0.0] * 27 + [0.0] * 32 + [3.0]])
    got = int16_blocks(x)
    step = torch.tensor(2.0, dtype=torch.float32).div(32767).double()  # the largest / 32767, in fp32
    # x * (32767 / 2): 8191.75, -16383.5 (to even: -16384), 16383.5 (16384), 12287.625, 32767
    expected = torch.tensor([8192, -16384, 16384, 12288, 32767], dtype=torch.float64) * step
    assert torch.equal(got[0, :5], expected)
    assert not got[0, 32:64].any()  # a block of zeros stays zeros
    assert got[0, 64].item() == pytest.approx(3.0)  # a last block of one input, padded with zeros


def _q8_0_weight(linear: nn.Linear) -> torch.Tensor:
    """The C int8 layer's weight in float64: Q8_0's steps times their block's scale."""
    steps, scale = q8_0(linear.weight.detach())
    return steps.double() * scale.double().repeat_interleave(32, dim=1)[:, :steps.shape[1]]


@pytest.mark.parametrize("shape", [(576, 8192), (64, 48)])
def test_the_c_int8_kernel_is_exact_but_for_its_rounded_activations(shape):
    """The output layer against float64 on its Q8_0 weights and on x as the kernel rounds it
    (to int16 per block): its error is fp32 rounding. PyTorch's kernel (a scale per output) rounds
    x, its scales and its output to bf16, and errs a hundred times more on its own weights."""
    torch.manual_seed(0)
    linear = nn.Linear(*shape, bias=False)
    x = torch.randn(7, shape[0])
    c, pytorch = _int8(linear, "c"), _int8(linear, "pytorch")
    c_err = (c(x).double() - int16_blocks(x) @ _q8_0_weight(linear).t()).abs().max().item()
    torch_weight = pytorch.weight_int8.double() * pytorch.scales.double()[:, None]
    pytorch_err = (pytorch(x).double() - x.to(torch.bfloat16).double() @ torch_weight.t()).abs().max().item()
    assert c_err < 2e-5 and c_err * 100 < pytorch_err
    with pytest.raises(ValueError, match="^dtype: int8 layers run on CPU with fp16 scales"):
        c.to(torch.bfloat16)(x)


def test_q8_0_weights_keep_their_steps_and_scales():
    """A Q8_0 GGUF's output layer, dequantized when the model loads, quantizes back to its own
    steps and fp16 scales (the gguf package's Q8_0 makes them)."""
    gguf_quants = pytest.importorskip("gguf.quants")
    from gguf import GGMLQuantizationType
    torch.manual_seed(0)
    weight = torch.randn(48, 96).numpy()
    blocks = gguf_quants.quantize(weight, GGMLQuantizationType.Q8_0)
    published = torch.from_numpy(gguf_quants.dequantize(blocks, GGMLQuantizationType.Q8_0)).float()
    steps, scale = q8_0(published)
    assert torch.equal(steps.float() * scale.float().repeat_interleave(32, dim=1), published)
    assert torch.equal(q8_0(steps.float() * scale.float().repeat_interleave(32, dim=1))[0], steps)


@pytest.mark.parametrize("width", [63, 40])
def test_the_c_int8_kernel_takes_any_width(width):
    """A width that is not whole blocks pads its last block with zeros (an odd one ends on a
    single input); each row still comes out as it does alone."""
    torch.manual_seed(0)
    linear = nn.Linear(width, 48, bias=False)
    layer = _int8(linear, "c")
    x = torch.randn(17, width)
    exact = int16_blocks(x) @ _q8_0_weight(linear).t()
    assert (layer(x).double() - exact).abs().max().item() < 2e-5
    assert torch.equal(torch.cat([layer(x[i:i + 1]) for i in range(17)]), layer(x))


@pytest.fixture(scope="module")
def four_bit_llama(llama_model, tmp_path_factory) -> str:
    """The tiny llama with its Linear weights snapped to 4-bit groups: a Q4_1 GGUF's shape."""
    model = AutoModelForCausalLM.from_pretrained(llama_model, dtype=torch.float32)
    for module in model.modules():
        if type(module) is nn.Linear and module is not model.get_output_embeddings():
            out, width = module.weight.shape
            steps, scale, low, _ = _quantize(module.weight.detach())
            module.weight.data = dequantize(steps, scale, low)
    path = tmp_path_factory.mktemp("four_bit_llama")
    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(llama_model).save_pretrained(path)
    return str(path)


def test_auto_on_cpu_is_int4_only_for_weights_that_already_are_4bit(llama_model, four_bit_llama):
    assert load_model(EngineConfig(model=four_bit_llama, device="cpu")).info.dtype == "int4"
    assert load_model(EngineConfig(model=llama_model, device="cpu")).info.dtype == "float32"
    forced = load_model(EngineConfig(model=llama_model, device="cpu", dtype="int4"))
    assert forced.info.dtype == "int4"
    assert forced.model.config._attn_implementation.startswith("paged")  # "paged_float16" with an fp16 pool


def test_int4_is_refused_where_it_cannot_run(gpt2_model):
    with pytest.raises(ValueError, match="^dtype: int4 runs on CPU only"):
        pick_dtype("int4", torch.device("cuda"))
    with pytest.raises(ValueError, match="^dtype: int4 needs Linear layers"):
        load_model(EngineConfig(model=gpt2_model, device="cpu", dtype="int4"))  # GPT-2: Conv1D
    with pytest.raises(ValueError, match="^dtype: unknown 'int3'; choose auto, int4"):
        pick_dtype("int3", torch.device("cpu"))
    assert not quantize(nn.Sequential(nn.Linear(30, 8)))  # 30 inputs: not whole groups


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("sample", [False, True], ids=["greedy", "seeded"])
async def test_int4_batched_output_equals_output_alone(four_bit_llama, make_engine, sample, seed):  # noqa: F811
    """12 concurrent requests, prompts chunked (16-token budget) or padded: same tokens as alone."""
    engine = make_engine(four_bit_llama, device="cpu", max_prefill_tokens=16)
    assert engine.core.loaded.info.dtype == "int4"
    await _assert_batched_equals_alone(engine, seed, sample)


async def _assert_batched_equals_alone(engine, seed: int, sample: bool) -> None:
    requests = mixed_requests(12, seed=seed, sample=sample)
    alone = [await collect(engine, p, params) for p, params in requests]
    together = await asyncio.gather(*(collect(engine, p, params) for p, params in requests))
    assert together == alone


async def test_int4_batched_output_equals_output_alone_without_the_c_kernels(four_bit_llama, make_engine,  # noqa: F811
                                                                             monkeypatch):
    """Where no C compiler builds native.py's kernels: PyTorch's int4 kernel and one SDPA call per sequence."""
    monkeypatch.setattr(build, "library", lambda: None)
    engine = make_engine(four_bit_llama, device="cpu", max_prefill_tokens=16)
    assert not any(getattr(m, "c_kernel", False) for m in engine.core.loaded.model.modules())
    await _assert_batched_equals_alone(engine, 0, False)


@pytest.mark.parametrize("whole_layers", [True, False], ids=["llama_layer.c", "attention.c"])
async def test_int4_prefill_and_decode_steps_run_the_c_kernels(four_bit_llama, monkeypatch, make_engine,  # noqa: F811
                                                                whole_layers):
    """Every layer of every step (the start-up probe, the prefill, 3 decode steps) runs in C: the
    whole stack in llama_layer.c, or (in transformers' layers) its attention in paged_attention.c."""
    if native.library() is None:
        pytest.skip("no C compiler on this machine")
    results = []

    def spy(real):
        def call(*args):
            results.append(real(*args))
            return results[-1]
        return call

    if whole_layers:  # one call a step, the probe's included
        monkeypatch.setattr(llama_layer, "llama_layers", spy(llama_layer.llama_layers))
    else:
        monkeypatch.setattr(loader, "plan", native_reference.reference_plan)
        monkeypatch.setattr(paged_attention, "c_paged_attention", spy(native.paged_attention))
    engine = make_engine(four_bit_llama, device="cpu")
    ids, _, _ = await collect(engine, "the quick brown fox", SamplingParams(max_tokens=4, ignore_eos=True))
    layers = engine.core.loaded.model.config.num_hidden_layers
    assert len(ids) == 4 and len(results) == (5 if whole_layers else 5 * layers)
    assert all(r is not None for r in results)


async def _answers(engine, requests) -> list[tuple[list[int], list[float]]]:
    answers = []
    for prompt, params in requests:
        params.logprobs, params.top_logprobs = True, 2
        outs = [o async for o in engine.generate(prompt, params)]
        answers.append(([t for o in outs for t in o.token_ids], [lp for o in outs for lp in o.logprobs]))
    return answers


def _stack_and_reference(four_bit_llama, make_engine, monkeypatch, prefill: int = 16, **config):
    """(an engine whose steps run the C stack, one whose steps run transformers' layers with the
    C norms and activations (testing/native_reference.py), requests for both)."""
    if not native.int4_ready():
        pytest.skip("int4_matmul.c does not run here")
    stack = make_engine(four_bit_llama, device="cpu", max_prefill_tokens=prefill, **config)
    assert stack.core.loaded.plan.stack is not None, stack.core.loaded.plan
    with monkeypatch.context() as patch:
        patch.setattr(loader, "plan", native_reference.reference_plan)
        reference = make_engine(four_bit_llama, device="cpu", max_prefill_tokens=prefill, **config)
    assert reference.core.loaded.plan.stack is None
    requests = mixed_requests(6, seed=3) + mixed_requests(6, seed=4, sample=True)
    if prefill > 16:  # prompts long enough to fill wide steps
        requests = [(" ".join([prompt] * 5), params) for prompt, params in requests]
    return stack, reference, requests


@pytest.mark.parametrize("prefill", [16, 256])
async def test_whole_c_layers_give_the_numbers_of_transformers_layers(four_bit_llama, make_engine, monkeypatch,
                                                                       prefill):
    """llama_layer.c, the whole stack in one call per step: the same tokens and log probabilities
    as transformers' layers (which then use its norms and SiLU), bit for bit, greedy and seeded;
    with steps of a few tokens, and with prompts' steps wide enough for its loops between the
    matmuls to run in parallel."""
    stack, reference, requests = _stack_and_reference(four_bit_llama, make_engine, monkeypatch, prefill)
    assert any(isinstance(m, native_reference.NativeRMSNorm) for m in reference.core.loaded.model.modules())
    assert not any(isinstance(m, native_reference.NativeRMSNorm) for m in stack.core.loaded.model.modules())
    widths: list[int] = []
    real = llama_layer.llama_layers
    monkeypatch.setattr(llama_layer, "llama_layers", lambda stack, step, *rest: widths.append(step.tokens) or
                        real(stack, step, *rest))
    answers = await _answers(stack, requests)
    assert (max(widths) >= 128) == (prefill > 16)  # llama_layer.c's parallel loops from 64 tokens (SiLU: 16384 values)
    assert answers == await _answers(reference, requests) and all(ids for ids, _ in answers)


def test_the_native_norm_and_silu_fall_back_off_cpu_fp32():
    torch.manual_seed(0)
    norm = native_reference.NativeRMSNorm(64, eps=1e-5)
    norm.weight.data.normal_()
    x = torch.randn(3, 64)
    torch.testing.assert_close(norm(x), nn.functional.rms_norm(x, (64,), norm.weight, 1e-5))
    assert norm(x.double()).dtype == torch.float64  # PyTorch's forward
    torch.testing.assert_close(native_reference.NativeSiLU()(x), nn.functional.silu(x))
    assert native_reference.NativeSiLU()(x.double()).dtype == torch.float64


def test_the_native_silu_is_accurate_and_the_same_wherever_a_value_sits():
    """llama_layer.c's vector SiLU: within 5e-7 of float64 from -100 to 100, and a value gets the
    same result in a whole vector as in the padded tail (a row's width does not matter)."""
    if native.library() is None:
        pytest.skip("no C compiler here")
    x = torch.linspace(-100, 100, 200_001)
    exact = x.double() / (1 + torch.exp(-x.double()))
    error = (native.silu(x).double() - exact).abs() / exact.abs().clamp_min(1e-30)
    assert error.max() < 5e-7
    values = torch.randn(37) * 10
    alone = torch.cat([native.silu(values[i:i + 1]) for i in range(37)])
    assert torch.equal(native.silu(values), alone)


def test_a_c_int4_layer_follows_its_buffers_and_refuses_what_it_cannot_run():
    """The layer hands the C kernel its buffers' addresses: a move must point it again, and a
    move off CPU or to fp32 scales must be refused rather than read as garbage."""
    torch.manual_seed(0)
    layer = _int4(nn.Linear(64, 48), "c")
    x = torch.randn(3, 64)
    before = layer(x)
    old = layer.weights
    layer._apply(lambda t: t.clone())  # as a move does: new tensors at new addresses
    assert layer.weights != old and torch.equal(layer(x), before)
    with pytest.raises(ValueError, match="^dtype: int4 layers run on CPU with fp16 scales"):
        layer.float()


def test_q4_0_blocks_are_kept_exactly():
    """Weights that llama.cpp's Q4_0 quantized (the gguf package's reference code), as a Q4_0
    GGUF holds them, are taken without loss: d·(q - 8) is 4-bit steps from -8·d."""
    from gguf import GGMLQuantizationType, quants
    torch.manual_seed(1)
    weight = torch.randn(64, 256)
    kind = GGMLQuantizationType.Q4_0
    q4_0 = torch.from_numpy(quants.dequantize(quants.quantize(weight.numpy(), kind), kind)).float()
    steps, scale, low, exact = _quantize(q4_0)
    assert exact and torch.equal(dequantize(steps, scale, low), q4_0)
    assert not _quantize(weight)[3]


def test_a_folders_int4_layers_are_kept_for_its_next_load(four_bit_llama, llama_model, tmp_path, monkeypatch):
    """The first load finds the layers and keeps them (engine/model/int4_cache.py); the next builds the
    same buffers from the cache without finding them again; a folder that is not 4-bit keeps none."""
    from engine.model import int4_cache, quant_cache
    monkeypatch.setenv("LLM_QUANT_CACHE", str(tmp_path / "cache"))

    def fresh(folder: str) -> nn.Module:
        return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)

    def buffers(model: nn.Module) -> dict[str, torch.Tensor]:
        return dict(model.named_buffers())

    plain = fresh(four_bit_llama)
    assert quantize(plain, only_if_exact=True)
    first = fresh(four_bit_llama)
    assert int4_cache.quantize_exact(first, four_bit_llama)
    assert len(list(quant_cache.root().iterdir())) == 2  # the entry, and the files' hashes
    monkeypatch.setattr(int4_cache, "swaps", lambda *args, **kwargs: pytest.fail("found again"))
    second = fresh(four_bit_llama)
    assert int4_cache.quantize_exact(second, four_bit_llama)
    for model in (first, second):
        assert buffers(model).keys() == buffers(plain).keys()
        assert all(torch.equal(buffer, buffers(plain)[name]) for name, buffer in buffers(model).items())
        assert {type(m) for m in model.modules()} >= {Int4Linear, Int8Linear}
    monkeypatch.undo()
    monkeypatch.setenv("LLM_QUANT_CACHE", str(tmp_path / "other"))
    assert not int4_cache.quantize_exact(fresh(llama_model), llama_model)
    assert [p.name for p in quant_cache.root().iterdir()] == ["hashes.json"]
