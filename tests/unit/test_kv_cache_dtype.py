"""An fp16 KV cache (EngineConfig.kv_cache_dtype): the C attention reads fp16 keys as the fp32 keys
of the same values, every path writes them rounded alike (test_paged_attention.py checks each
attention path), and the engine keeps its guarantees (batched == alone, cached == uncached, C
layers == transformers' layers == a direct forward) in half the memory."""
import asyncio

import pytest
import torch

from contract import EngineConfig, SamplingParams, ValidationError
from engine.kernels import llama_layer, native
from engine.policies.logprobs import log_softmax
from testing import golden
from testing.native_reference import as_the_engine_computes
from tests.unit.test_batching import collect, mixed_requests
from tests.unit.test_int4 import _answers, _stack_and_reference, four_bit_llama  # noqa: F401 - a fixture
from tests.unit.test_paged_attention import MIXED, c_args, step


@pytest.mark.parametrize("path", list(golden.kernel_paths()))
@pytest.mark.parametrize("heads,kv_heads,dim", [(9, 3, 64), (4, 2, 16), (8, 8, 128), (2, 1, 80)])
def test_fp16_keys_give_the_bits_of_fp32_keys_of_the_same_values(heads, kv_heads, dim, path, kernel_libraries):
    """On every kernel path this CPU builds (F16C's widening, or the integer one)."""
    if path not in kernel_libraries:
        pytest.skip(f"the {path} path is not built here")
    with golden.kernels(kernel_libraries[path]):
        _fp16_keys_give_the_bits_of_fp32_keys(heads, kv_heads, dim)


def _fp16_keys_give_the_bits_of_fp32_keys(heads: int, kv_heads: int, dim: int) -> None:
    query, k_pool, v_pool, tables, q_lens, ctx_lens = step(MIXED, heads, kv_heads, dim, seed=5)
    k_half, v_half = k_pool.half(), v_pool.half()
    args = c_args(tables, q_lens, ctx_lens)
    half = native.paged_attention(query, k_half, v_half, args, dim ** -0.5, 0)
    widened = native.paged_attention(query, k_half.float(), v_half.float(), args, dim ** -0.5, 0)
    assert half is not None and widened is not None and torch.equal(half, widened)
    at = 0
    for s, q in enumerate(q_lens):  # batched == alone
        alone = native.paged_attention(query[:, :, at:at + q], k_half, v_half,
                                       c_args(tables[s:s + 1], [q], ctx_lens[s:s + 1]), dim ** -0.5, 0)
        assert alone is not None and torch.equal(alone, half[at:at + q]), s
        at += q


def test_the_option_takes_its_choices_and_refuses_others_naming_the_field():
    assert EngineConfig(model="m", kv_cache_dtype="fp16").validate().kv_cache_dtype == "fp16"
    assert EngineConfig.from_env({"LLM_KV_CACHE_DTYPE": "fp16"}) == {"kv_cache_dtype": "fp16"}
    with pytest.raises(ValidationError) as err:
        EngineConfig(model="m", kv_cache_dtype="int8").validate()
    assert err.value.field == "kv_cache_dtype" and "auto, fp32, fp16" in str(err.value)


async def test_an_fp16_cache_holds_twice_the_tokens_and_keeps_batched_equal_to_alone(four_bit_llama,  # noqa: F811
                                                                                     make_engine):
    budget = 1 << 20
    wide = make_engine(four_bit_llama, kv_cache_bytes=budget, kv_cache_dtype="fp32")
    half = make_engine(four_bit_llama, kv_cache_bytes=budget, kv_cache_dtype="fp16", max_prefill_tokens=16)
    assert half.info.kv_cache_dtype == "float16" and wide.info.kv_cache_dtype == "float32"
    assert half.core.kv.pool.keys.dtype == torch.float16
    assert half.stats()["kv_blocks"] in (2 * wide.stats()["kv_blocks"], 2 * wide.stats()["kv_blocks"] + 1)
    for sample in (False, True):
        requests = mixed_requests(16, seed=7, sample=sample)
        alone = [await collect(half, p, params) for p, params in requests]
        assert await asyncio.gather(*(collect(half, p, params) for p, params in requests)) == alone


async def test_an_fp16_cache_gives_a_cached_prefix_the_answer_of_an_uncached_one(four_bit_llama,  # noqa: F811
                                                                                make_engine):
    cached = make_engine(four_bit_llama, kv_cache_dtype="fp16", max_prefill_tokens=16)
    fresh = make_engine(four_bit_llama, kv_cache_dtype="fp16", max_prefill_tokens=16, prefix_caching=False)
    shared = "the quick brown fox jumps over a lazy dog " * 6
    params = SamplingParams(max_tokens=12, ignore_eos=True, logprobs=True)
    await collect(cached, shared + "first", params)
    answers = [await _answers(engine, [(shared + "second", params)]) for engine in (cached, fresh)]
    assert cached.stats()["prefix_cache_hits"] > 0 and answers[0] == answers[1] and answers[0][0][0]


async def test_whole_c_layers_write_fp16_keys_as_transformers_layers_do(four_bit_llama, make_engine,  # noqa: F811
                                                                          monkeypatch):
    """llama_layer.c rounds each new key and value to fp16 as PyTorch's .to(torch.float16) does
    (transformers' layers write through KVPool.write): the same tokens and log probabilities."""
    if not native.kv_half_ready():
        pytest.skip("no C kernels for an fp16 pool here")
    stack, reference, requests = _stack_and_reference(four_bit_llama, make_engine, monkeypatch,
                                                      kv_cache_dtype="fp16")
    ran: list[bool] = []
    real = llama_layer.llama_layers
    monkeypatch.setattr(llama_layer, "llama_layers", lambda *args: ran.append((out := real(*args)) is not None) or out)
    answers = await _answers(stack, requests)
    assert ran and all(ran)  # every step in C, with the fp16 pool
    assert answers == await _answers(reference, requests) and all(ids for ids, _ in answers)


async def test_auto_is_fp16_for_int4_weights_and_the_models_dtype_otherwise(four_bit_llama, llama_model,  # noqa: F811
                                                                            make_engine):
    int4, fp32 = make_engine(four_bit_llama), make_engine(llama_model)
    assert int4.info.dtype == "int4" and fp32.info.dtype == "float32"
    assert int4.info.kv_cache_dtype == ("float16" if native.kv_half_ready() else "float32")
    assert fp32.info.kv_cache_dtype == "float32" and fp32.core.kv.pool.keys.dtype == torch.float32
    assert make_engine(llama_model, kv_cache_dtype="fp16").core.kv.pool.keys.dtype == torch.float16


async def test_a_direct_forward_rounds_its_keys_as_the_engine_does(four_bit_llama, make_engine):  # noqa: F811
    """What `python -m benchmarks quality` scores (the loaded model's forward and generate) is what
    the engine computes with an fp16 cache, bit for bit: greedy tokens and their log probabilities."""
    engine = make_engine(four_bit_llama, kv_cache_dtype="fp16", max_prefill_tokens=16)
    prompt = "the quick brown fox jumps over a lazy dog while streams of tokens flow"
    params = SamplingParams(max_tokens=16, ignore_eos=True, logprobs=True)
    [(ids, logprobs)] = await _answers(engine, [(prompt, params)])
    loaded, tokens = engine.core.loaded, engine.tokenizer(prompt)["input_ids"]
    model = as_the_engine_computes(loaded.model, loaded.plan.stack is not None)
    with torch.inference_mode():
        generated = model.generate(torch.tensor([tokens]), max_new_tokens=16, do_sample=False, min_new_tokens=16)
        rows = log_softmax(model(torch.tensor([tokens + ids])).logits[0])
    assert generated[0, len(tokens):].tolist() == ids
    assert [float(rows[len(tokens) - 1 + k, t]) for k, t in enumerate(ids)] == logprobs


async def test_a_cache_the_c_layers_do_not_read_is_served_by_transformers_layers(four_bit_llama,  # noqa: F811
                                                                                 make_engine, monkeypatch):
    """An fp16 KV cache where llama_layer.c cannot read one (a CPU without F16C, as the plan is
    told here): the load plans transformers' layers and says why, and the engine serves, batched
    as alone."""
    monkeypatch.setattr(native, "kv_half_ready", lambda: False)
    engine = make_engine(four_bit_llama, kv_cache_dtype="fp16", max_prefill_tokens=16)
    plan = engine.core.loaded.plan
    assert plan.stack is None and "KV cache of fp32 or fp16 (with F16C)" in plan.why
    requests = mixed_requests(6, seed=2)
    alone = [await collect(engine, p, params) for p, params in requests]
    assert await asyncio.gather(*(collect(engine, p, params) for p, params in requests)) == alone
    assert all(ids for ids, _, _ in alone)
