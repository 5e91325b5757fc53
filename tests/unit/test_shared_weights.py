"""engine/model/shared_weights.py: a model's weights mapped from one file that every engine
process serving the same bytes maps, with the same numbers as private weights."""
import asyncio
from pathlib import Path

import numpy as np
import pytest
import torch

from contract import EngineConfig, SamplingParams
from engine import AsyncEngine
from engine.model import shared_weights
from engine.model.int4 import Int4Linear
from engine.model.loader import load_model


def mapped_from(path: Path) -> list[tuple[int, int]]:
    """This process's address ranges that map `path`."""
    ranges = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) >= 6 and fields[5] == str(path):
                low, high = (int(x, 16) for x in fields[0].split("-"))
                ranges.append((low, high))
    return ranges


def inside(tensor: torch.Tensor, ranges: list[tuple[int, int]]) -> bool:
    start = tensor.data_ptr()
    return any(low <= start and start + tensor.numel() * tensor.element_size() <= high for low, high in ranges)


def answers(model: str) -> list[tuple[list[int], list[float]]]:
    engine = AsyncEngine(EngineConfig(model=model))
    try:
        async def one(prompt: str) -> tuple[list[int], list[float]]:
            tokens, logprobs = [], []
            async for out in engine.generate(prompt, SamplingParams(max_tokens=12, ignore_eos=True)):
                tokens += out.token_ids
                logprobs += out.logprobs
            return tokens, logprobs
        async def both():
            return await asyncio.gather(one("The weights of"), one("Two replicas share"))
        return asyncio.run(both())
    finally:
        engine.shutdown()


def test_weights_mapped_from_the_file_give_the_same_tokens_and_logprobs(int4_llama_model, tmp_path, monkeypatch):
    monkeypatch.setenv("LLM_SHARE_WEIGHTS", "off")
    private = answers(int4_llama_model)
    monkeypatch.setenv("LLM_SHARE_WEIGHTS", "on")
    monkeypatch.setenv("LLM_WEIGHTS_CACHE", str(tmp_path))
    assert answers(int4_llama_model) == private  # written, then mapped
    assert answers(int4_llama_model) == private  # found, and mapped
    assert len(list(tmp_path.glob("*.weights"))) == 1 and not list(tmp_path.glob(".*partial"))


def test_every_int4_layer_reads_the_file_including_the_joined_ones(int4_llama_model, tmp_path, monkeypatch):
    """q, k, v (and gate, up) are joined into one buffer by the C stack: once shared, the plan
    built again takes the file's copy as it is, not a copy of it."""
    monkeypatch.setenv("LLM_SHARE_WEIGHTS", "on")
    monkeypatch.setenv("LLM_WEIGHTS_CACHE", str(tmp_path))
    loaded = load_model(EngineConfig(model=int4_llama_model, device="cpu"))
    (path,) = tmp_path.glob("*.weights")
    ranges = mapped_from(path)
    buffers = [b for m in loaded.model.modules() if isinstance(m, Int4Linear) for b in (m.packed, m.scale, m.low)]
    large = [b for b in buffers if b.untyped_storage().nbytes() >= shared_weights.SMALLEST]
    assert ranges and large and all(inside(b, ranges) for b in large)
    kept = [(b.untyped_storage().data_ptr(), b.untyped_storage().nbytes()) for b in buffers
            if b.untyped_storage().nbytes() < shared_weights.SMALLEST]
    assert loaded.plan is not None and loaded.plan.stack is not None
    pointers = []  # what llama_layer.c reads: the stack's structs, built again over the file's copy
    for layer in loaded.plan.stack.layers:
        struct = layer.struct
        for weight in (*struct.qkv, struct.o, *struct.gate_up, struct.down):
            if weight.outputs:
                pointers += [weight.packed, weight.scale]
    assert pointers and all(any(low <= p < high for low, high in [*ranges, *((a, a + n) for a, n in kept)])
                            for p in pointers)  # the file's, or a small tensor's that stayed: none freed


def test_a_write_stays_in_its_process_and_the_file_is_unchanged(tmp_path):
    model = torch.nn.Module()
    model.register_buffer("big", torch.arange(1 << 19, dtype=torch.float32))  # 2 MiB
    path = shared_weights.share(model, tmp_path)
    assert path is not None and inside(model.big, mapped_from(path))
    before = path.read_bytes()
    model.big[0] = 123.0  # copy-on-write: this process's page, not the file's
    assert path.read_bytes() == before and model.big[0].item() == 123.0
    assert np.array_equal(np.fromfile(path, dtype=np.float32)[:8], np.arange(8, dtype=np.float32))


def test_a_folder_that_cannot_be_written_leaves_the_weights_private(tmp_path):
    model = torch.nn.Module()
    model.register_buffer("big", torch.ones(1 << 19))
    before = model.big.data_ptr()
    blocked = tmp_path / "a file, not a folder"
    blocked.write_text("")
    assert shared_weights.share(model, blocked) is None
    assert model.big.data_ptr() == before and torch.equal(model.big, torch.ones(1 << 19))


@pytest.mark.parametrize(("share", "replicas", "shared"), [("auto", None, False), ("auto", "1", False),
                                                        ("auto", "2", True), ("on", None, True), ("off", "2", False)])
def test_auto_shares_where_this_machine_runs_several_replicas(share, replicas, shared, tmp_path, monkeypatch):
    monkeypatch.setenv("LLM_SHARE_WEIGHTS", share)
    monkeypatch.setenv("LLM_WEIGHTS_CACHE", str(tmp_path))
    if replicas is None:
        monkeypatch.delenv("LLM_REPLICAS", raising=False)
    else:
        monkeypatch.setenv("LLM_REPLICAS", replicas)
    assert shared_weights.root() == (tmp_path if shared else None)


def test_a_file_cut_short_is_not_mapped(tmp_path):
    """A file of the right name whose length is not the layout's (cut by a full disk or by hand)
    leaves the weights private rather than serving other bytes."""
    first = torch.nn.Module()
    first.register_buffer("big", torch.arange(1 << 19, dtype=torch.float32))
    path = shared_weights.share(first, tmp_path)
    assert path is not None
    with open(path, "r+b") as cut:
        cut.truncate(path.stat().st_size // 2)
    second = torch.nn.Module()
    second.register_buffer("big", torch.arange(1 << 19, dtype=torch.float32))
    before = second.big.data_ptr()
    assert shared_weights.share(second, tmp_path) is None
    assert second.big.data_ptr() == before and torch.equal(second.big, torch.arange(1 << 19, dtype=torch.float32))
