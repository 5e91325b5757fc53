"""LoRA adapters (EngineConfig.lora, LLM_LORA) served beside their base model: a request picks one by
its model name; the base and every adapter share one batched step; each answer is its merged
model's."""
import asyncio
import json
import shutil
from pathlib import Path

import pytest
import torch

from contract import EngineConfig, SamplingParams, ValidationError
from engine.model.loader import load_model
from engine.model.lora import LoraLinear
from gateway.fleet.prefix_keys import PrefixKeys, TokenizerSpec
from testing import lora_adapters
from tests.unit.test_batching import collect, mixed_requests


@pytest.fixture(scope="module")
def adapters(llama_model, tmp_path_factory) -> dict[str, Path]:
    return lora_adapters.make(llama_model, tmp_path_factory.mktemp("lora"))


# 61 tokens: its first three blocks are cached for the next request that starts with them
PROMPT = ("the quick brown fox jumps over a lazy dog while streams of tokens flow through batched decode steps "
          "and every client reads its own answer one piece at a time " * 2).strip()


async def test_each_adapter_answers_as_its_merged_model_and_the_base_as_itself(make_engine, llama_model, adapters):
    """The base and both adapters in one batch, and one after another with the same prompt (a
    prompt's cached blocks are never another adapter's): each answer is its merged model's."""
    served = make_engine(llama_model, lora=lora_adapters.spec(adapters), max_prefill_tokens=16)
    params = {name: SamplingParams(max_tokens=16, ignore_eos=True, model=name) for name in (None, "a", "b")}
    together = await asyncio.gather(*(collect(served, PROMPT, p) for p in params.values()))
    one_by_one = {name: (await collect(served, PROMPT, p))[0] for name, p in params.items()}
    expected = {None: (await collect(make_engine(llama_model), PROMPT, params[None]))[0]}
    for name, folder in adapters.items():
        merged = make_engine(str(lora_adapters.merged(folder)))
        expected[name] = (await collect(merged, PROMPT, SamplingParams(max_tokens=16, ignore_eos=True)))[0]
    assert dict(zip(params, (answer[0] for answer in together), strict=True)) == one_by_one == expected
    assert len({tuple(a) for a in expected.values()}) == 3  # the adapters change the answers


def test_an_adapters_logits_are_its_merged_models_within_float_rounding(llama_model, adapters):
    loaded = load_model(EngineConfig(model=llama_model, lora=lora_adapters.spec(adapters)))
    assert loaded.lora is not None and "LoRA adapters" in loaded.plan.why
    assert sum(isinstance(m, LoraLinear) for m in loaded.model.modules()) == 2 * 7  # a's 3 and b's 4 per layer
    ids = torch.tensor([[5, 17, 42, 9, 28, 3, 11]])
    for index, name in enumerate(lora_adapters.ADAPTERS):
        merged = load_model(EngineConfig(model=str(lora_adapters.merged(adapters[name]))))
        loaded.lora.selection.choose([index], [ids.shape[1]])
        with torch.no_grad():
            ours, theirs = loaded.model(ids).logits, merged.model(ids).logits
        loaded.lora.selection.choose([], [])
        assert torch.allclose(ours, theirs, rtol=1e-4, atol=1e-4), (ours - theirs).abs().max()
        assert not torch.equal(ours, loaded.model(ids).logits)  # the base's own


async def test_a_rows_tokens_do_not_depend_on_its_neighbours_adapters(make_engine, llama_model, adapters):
    engine = make_engine(llama_model, lora=lora_adapters.spec(adapters), max_prefill_tokens=16)
    for sample in (False, True):
        requests = mixed_requests(12, seed=5, sample=sample)
        for i, (_, params) in enumerate(requests):
            params.model = (None, "a", "b")[i % 3]
        alone = [await collect(engine, p, params) for p, params in requests]
        assert await asyncio.gather(*(collect(engine, p, params) for p, params in requests)) == alone


def test_a_malformed_adapter_stops_the_load_naming_it(llama_model, gpt2_model, adapters, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(adapters["a"], broken)
    config = json.loads((broken / "adapter_config.json").read_text())
    (broken / "adapter_config.json").write_text(json.dumps({**config, "use_dora": True}))
    for lora, says in ((f"x={tmp_path / 'nothing'}", "lora adapter 'x'"), (f"d={broken}", "use_dora True"),
                       (f"g={adapters['a']}", "is no Linear layer of the model")):
        with pytest.raises(RuntimeError, match=says):
            load_model(EngineConfig(model=gpt2_model if lora.startswith("g=") else llama_model, lora=lora))
    for lora in ("a", "a=x,a=y", "a:b=x"):
        with pytest.raises(ValidationError) as err:
            EngineConfig(model=llama_model, lora=lora).validate()
        assert err.value.field == "lora"


async def test_the_routers_prefix_keys_of_an_adapters_prompt_are_the_engines(make_engine, llama_model, adapters):
    """The gateway's router predicts where a prompt's blocks are cached by keying them as the engine
    does: an adapter's from its own root, so that its requests go where its blocks are."""
    engine = make_engine(llama_model, lora=lora_adapters.spec(adapters), max_prefill_tokens=16)
    await collect(engine, PROMPT, SamplingParams(max_tokens=2, model="a"))
    router = PrefixKeys(TokenizerSpec.from_json(json.dumps({
        "tokenizer": engine.tokenizer.backend_tokenizer.to_str(), "chat_template": None, "special_tokens": {},
        "block_size": engine.core.kv.block_size})))
    predicted = router.keys(PROMPT, "", "a")
    assert len(predicted) == 3 and set(predicted) <= set(engine.core.kv.blocks.cached)  # where the engine keeps them
    assert set(router.keys(PROMPT, "", None)).isdisjoint(engine.core.kv.blocks.cached)  # the base's are other keys
