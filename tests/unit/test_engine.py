"""The engine alone: equality with transformers' generate, detokenization, stops, seeds."""
import asyncio
import json
import random

import pytest

from contract import EngineConfig, FinishReason, SamplingParams, ValidationError
from engine import AsyncEngine
from engine.policies.detokenizer import IncrementalDetokenizer, byte_fallback_ids
from engine.policies.stopping import StopSequenceFilter
from tests.conftest import ROOT

PROMPTS = ["the quick brown fox", "hello 東京 😀 café", "a",
           "streams of tokens flow through batched decode steps and every client reads"]
TRICKY = "naïve café résumé über straße 東京 日本語 テキスト 中文 😀🚀 ünïcödé  two  spaces"


@pytest.fixture(scope="module")
async def engines(gpt2_model, llama_model):
    made = {name: AsyncEngine(EngineConfig(model=path))
            for name, path in (("gpt2", gpt2_model), ("llama", llama_model))}
    yield made
    for engine in made.values():
        engine.shutdown()


async def run(engine: AsyncEngine, prompt: str, **kw):
    chunks = [c async for c in engine.generate(prompt, SamplingParams(**kw))]
    ids = [t for c in chunks for t in c.token_ids]
    return ids, chunks


@pytest.mark.parametrize("style", ["gpt2", "llama"])
async def test_greedy_equals_transformers_generate(engines, style):
    engine = engines[style]
    model, tok = engine.core.loaded.model, engine.tokenizer
    for prompt in PROMPTS:
        ids, chunks = await run(engine, prompt, max_tokens=24, ignore_eos=True)
        enc = tok(prompt, return_tensors="pt").to(model.device)
        ref = model.generate(**enc, max_new_tokens=24, min_new_tokens=24, do_sample=False)
        assert ids == ref[0, enc.input_ids.shape[1]:].tolist(), prompt
        assert "".join(c.text for c in chunks) == tok.decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize("style", ["gpt2", "llama"])
def test_detokenizer_on_multibyte_text_split_across_tokens(gpt2_model, llama_model, style):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(gpt2_model if style == "gpt2" else llama_model)
    ids = tok(TRICKY, add_special_tokens=False)["input_ids"]
    pieces = [tok.decode([i]) for i in ids]
    assert any("\ufffd" in p for p in pieces), "the test text must split characters across tokens"
    detok = IncrementalDetokenizer(tok, byte_fallback_ids(tok))
    parts = [detok.add(i) for i in ids] + [detok.flush()]
    assert "".join(parts) == tok.decode(ids) == TRICKY
    assert not any("\ufffd" in p for p in parts), "no document may carry half a character"
    if style == "llama":  # SentencePiece spaces survive between documents
        assert "  two  spaces" in "".join(parts)


@pytest.mark.parametrize("style", ["gpt2", "llama"])
def test_detokenizer_matches_decode_on_random_ids(gpt2_model, llama_model, style):
    """Any id sequence (invalid byte runs, specials in between) streams to exactly decode()."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(gpt2_model if style == "gpt2" else llama_model)
    rng = random.Random(0)
    hold = byte_fallback_ids(tok)
    for _ in range(300):
        ids = [rng.randrange(len(tok)) for _ in range(rng.randint(1, 40))]
        detok = IncrementalDetokenizer(tok, hold)
        streamed = "".join([detok.add(i) for i in ids] + [detok.flush()])
        assert streamed == tok.decode(ids, skip_special_tokens=True), ids


def test_stop_filter_never_streams_part_of_a_stop():
    f = StopSequenceFilter(["lo wo", "xyz"])
    out = [f.add(d) for d in ["hel", "l", "o w", "or"]]
    assert out == [("he", False), ("l", False), ("", False), ("", True)]
    f = StopSequenceFilter(["abc"])
    assert f.add("xab") == ("x", False)
    assert f.add("d") == ("abd", False)
    assert f.flush() == ""
    f = StopSequenceFilter(["ab"])
    assert f.add("xa") == ("x", False) and f.flush() == "a"


def test_stop_filter_hold_back_matches_brute_force():
    rng = random.Random(1)
    for _ in range(2000):
        stops = ["".join(rng.choices("ab c", k=rng.randint(1, 6))) for _ in range(rng.randint(1, 3))]
        f = StopSequenceFilter(stops)
        f._text = "".join(rng.choices("ab c", k=rng.randint(0, 12)))
        brute = max([k for s in stops for k in range(1, len(s)) if f._text.endswith(s[:k])], default=0)
        assert f._held_back() == brute, (stops, f._text)


async def test_integer_sampling_values_are_accepted(engines):
    ids, _ = await run(engines["gpt2"], "hello", max_tokens=5, do_sample=True, temperature=2,
                       repetition_penalty=2, seed=1)
    assert len(ids) == 5


@pytest.mark.parametrize("style", ["gpt2", "llama"])
async def test_stop_sequence_spanning_token_boundaries(engines, style):
    engine = engines[style]
    full_ids, full = await run(engine, "the quick brown fox", max_tokens=30, ignore_eos=True)
    text = "".join(c.text for c in full)
    pieces = [engine.tokenizer.decode(full_ids[:k], skip_special_tokens=True) for k in range(31)]
    # a stop string that starts inside one token's text and ends inside a later one
    start = len(pieces[5]) - 1
    stop = text[start:start + max(4, len(pieces[8]) - start)]
    assert stop and text.find(stop) >= 0
    _, chunks = await run(engine, "the quick brown fox", max_tokens=30, ignore_eos=True, stop=[stop])
    expected = text[:text.find(stop)]
    streamed = ""
    for c in chunks:
        streamed += c.text
        assert expected.startswith(streamed), "a part of the stop sequence was streamed"
    assert streamed == expected
    assert chunks[-1].finish_reason == FinishReason.STOP


async def test_eos_ends_the_generation(gpt2_model):
    probe = AsyncEngine(EngineConfig(model=gpt2_model))
    ids, _ = await run(probe, "hello", max_tokens=10, ignore_eos=True)
    probe.shutdown()
    engine = AsyncEngine(EngineConfig(model=gpt2_model, eos_token_ids=[ids[3]]))
    try:
        got, chunks = await run(engine, "hello", max_tokens=10)
        assert got == ids[:ids.index(ids[3]) + 1]
        assert chunks[-1].finish_reason == FinishReason.EOS
        assert chunks[-1].generated_tokens == len(got)
    finally:
        engine.shutdown()


@pytest.mark.parametrize("style", ["gpt2", "llama"])
async def test_seeded_sampling_repeats_and_seeds_differ(engines, style):
    engine = engines[style]
    kw = dict(max_tokens=20, do_sample=True, temperature=1.5, ignore_eos=True)
    a, ca = await run(engine, "hello", seed=11, **kw)
    b, _ = await run(engine, "hello", seed=11, **kw)
    c, _ = await run(engine, "hello", seed=12, **kw)
    assert a == b and a != c and ca[-1].seed == 11
    _, unseeded = await run(engine, "hello", **kw)
    assert unseeded[-1].seed is not None  # reported so the output can be replayed
    for opts in (dict(top_k=5), dict(top_p=0.8), dict(typical_p=0.5), dict(repetition_penalty=1.3)):
        x, _ = await run(engine, "hello", seed=5, **kw, **opts)
        y, _ = await run(engine, "hello", seed=5, **kw, **opts)
        assert x == y and len(x) == 20, opts


@pytest.mark.parametrize("style", ["gpt2", "llama"])
async def test_sampling_that_keeps_one_token_is_greedy(gpt2_model, llama_model, style):
    """top_k=1, top_p near 0 and temperature 0 keep only the top token. In fp32 on every device:
    a random model's bf16 logits (the CUDA default) tie at the top, and argmax and top-p's sort
    then pick different ones of the equal tokens (seen on an H100), both rightly."""
    engine = AsyncEngine(EngineConfig(model=gpt2_model if style == "gpt2" else llama_model, dtype="fp32"))
    try:
        greedy, _ = await run(engine, "hello", max_tokens=20, ignore_eos=True)
        for opts in (dict(top_k=1), dict(top_p=1e-6), dict(temperature=0.0)):
            same, _ = await run(engine, "hello", max_tokens=20, do_sample=True, seed=3, ignore_eos=True, **opts)
            assert same == greedy, opts
    finally:
        engine.shutdown()


async def test_repetition_penalty_matches_generate(engines):
    engine = engines["gpt2"]
    model, tok = engine.core.loaded.model, engine.tokenizer
    ids, _ = await run(engine, "the quick", max_tokens=20, repetition_penalty=1.5, ignore_eos=True)
    enc = tok("the quick", return_tensors="pt")
    ref = model.generate(**enc, max_new_tokens=20, min_new_tokens=20, do_sample=False,
                         repetition_penalty=1.5)
    assert ids == ref[0, enc.input_ids.shape[1]:].tolist()


@pytest.mark.parametrize("field,kw", [
    ("prompt", dict(prompt="")), ("prompt", dict(prompt="   ")),
    ("max_tokens", dict(max_tokens=0)), ("max_tokens", dict(max_tokens=5000)),
    ("max_tokens", dict(max_tokens=500)),  # prompt + max_tokens over the 512-token context
    ("temperature", dict(temperature=-0.1)), ("top_p", dict(top_p=0.0)),
    ("typical_p", dict(typical_p=2.0)), ("top_k", dict(top_k=-1)),
    ("repetition_penalty", dict(repetition_penalty=0.0)), ("seed", dict(seed=-1)),
    ("stop", dict(stop=[""])), ("prompt", dict(prompt="tok " * 600)),
    ("temperature", dict(temperature=float("inf"))), ("top_p", dict(top_p=float("nan"))),
    ("repetition_penalty", dict(repetition_penalty=float("inf"))), ("max_tokens", dict(max_tokens=True)),
    ("top_k", dict(top_k=2.5)), ("stop", dict(stop=["x" * 300]))])
async def test_invalid_requests_name_the_field_before_any_work(engines, field, kw):
    engine = engines["gpt2"]
    steps = engine.core.steps
    prompt = kw.pop("prompt", "hello " * 20)
    with pytest.raises(ValidationError) as err:
        engine.generate(prompt, SamplingParams(**{"max_tokens": 8, **kw}))
    assert err.value.field == field and str(err.value).startswith(field)
    assert engine.core.steps == steps and engine.stats()["waiting"] == 0
    ids, _ = await run(engine, "hello", max_tokens=3)  # still serving
    assert len(ids) == 3


async def test_model_never_runs_on_the_event_loop(engines):
    import threading
    engine = engines["gpt2"]
    model = engine.core.loaded.model
    threads = set()
    handle = model.register_forward_pre_hook(lambda *_: threads.add(threading.get_ident()))
    try:
        ticks = 0

        async def ticker():  # the loop keeps running while tokens are generated
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)
        task = asyncio.create_task(ticker())
        ids, _ = await run(engine, "hello", max_tokens=30, ignore_eos=True)
        task.cancel()
    finally:
        handle.remove()
    assert len(ids) == 30 and ticks > 30
    assert threads and threading.get_ident() not in threads


def test_the_configuration_page_documents_every_engine_option_with_its_default():
    """EngineConfig declares the options; docs/configuration.md's options table must keep up:
    every field with its default, and no row for an option that is gone."""
    from dataclasses import MISSING, fields

    from contract import EngineConfig
    section = (ROOT / "docs" / "configuration.md").read_text()
    lines = section.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| option |"))
    table = []  # the options table only (the environment variables' table follows it)
    for line in lines[start + 2:]:  # past the header and its --- row
        if not line.startswith("|"):
            break
        table.append(line)
    rows = {cells[1].strip(): cells[2].strip() for cells in (line.split("|") for line in table)}
    options = {f.name: f for f in fields(EngineConfig)}
    for key in rows:
        for name in key.split(","):  # model_name: the executor's own, beside EngineConfig's
            assert name.strip() in options or name.strip() == "model_name", f"configuration.md: {name.strip()} is no option"
    documented = {name.strip() for key in rows for name in key.split(",")}
    checked = 0
    for f in options.values():
        assert f.name in documented, f"docs/configuration.md: {f.name} is not in the options table"
        default = next(v for k, v in rows.items() if f.name in [n.strip() for n in k.split(",")])
        if f.default is MISSING:  # model ($LLM_MODEL) and limits (the environment's): no literal
            continue
        if f.default is None:
            assert default in ("null", "auto"), (f.name, default)  # null: decided at start
        elif isinstance(f.default, str):
            assert default == (f.default or "none"), (f.name, default, f.default)  # written plain, as `auto`
        else:
            assert default == json.dumps(f.default), (f.name, default, f.default)
        checked += 1
    assert checked >= 20, checked


def test_cuda_loads_turn_cudnn_attention_off_and_cpu_loads_leave_it():
    """cuDNN SDPA compiles a graph per new key length, i.e. at every decode step (measured on
    an H100: 60 ms a step instead of 9 for GPT-2 small). Setting the flag needs no GPU."""
    import torch

    from engine.model.loader import pick_attention_backends
    before = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        torch.backends.cuda.enable_cudnn_sdp(True)
        pick_attention_backends(torch.device("cpu"))
        assert torch.backends.cuda.cudnn_sdp_enabled()
        pick_attention_backends(torch.device("cuda", 0))
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.mem_efficient_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)
