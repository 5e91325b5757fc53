"""A GGUF model loaded here before: the executor's side builds the tokenizer kept from that load
itself, while the engine process loads, and the engine process sends none (TokenizerKept). The
answers, plain and constrained, are the ones a first load, whose tokenizer came through the pipe,
gives (the engine process then decodes with the kept tokenizer less its merges, and takes them
to encode: model/decoding_tokenizer.py). Building it
imports no PyTorch (the executor's process has none: 0.4 s of its start). A kept tokenizer
that this side cannot build fails the load naming its folder, with no engine process left."""
import subprocess
import sys

import pytest

from contract import EngineConfig, SamplingParams
from engine import EngineProcess
from engine.frontend import engine_process
from engine.frontend.kept_tokenizer import KeptTokenizer
from engine.model import gguf_file

GREEDY = SamplingParams(max_tokens=12, ignore_eos=True)
CONSTRAINED = SamplingParams(max_tokens=12, regex=r"[A-Z][a-z]+ (is|was) [a-z]+")  # the engine process encodes for it
PROMPT = "The capital of France is"


class Watched(KeptTokenizer):
    built: list["Watched"] = []

    def result(self):
        Watched.built.append(self)
        return super().result()


async def answer(engine: EngineProcess, params: SamplingParams = GREEDY) -> tuple[str, list[int]]:
    chunks = [c async for c in await engine.open(PROMPT, params)]
    return "".join(c.text for c in chunks), [t for c in chunks for t in c.token_ids]


async def test_a_second_load_builds_the_kept_tokenizer_here(default_gguf, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(engine_process, "KeptTokenizer", Watched)
    Watched.built.clear()
    first = EngineProcess(EngineConfig(model=default_gguf))
    try:
        assert Watched.built == []  # nothing kept yet: the engine process sent its own
        sent = await answer(first)
        constrained = await answer(first, CONSTRAINED)
        ids = first.preparer.tokenizer(PROMPT)["input_ids"]
    finally:
        first.shutdown()
    folder = gguf_file.kept_tokenizer(default_gguf)
    assert folder is not None and folder.parent == tmp_path / "llm-stream" / "gguf"
    second = EngineProcess(EngineConfig(model=default_gguf))
    try:
        assert [w.folder for w in Watched.built] == [str(folder)]
        assert second.preparer.tokenizer.name_or_path == str(folder)
        assert second.preparer.tokenizer(PROMPT)["input_ids"] == ids
        assert await answer(second) == sent and len(sent[1]) == GREEDY.max_tokens
        # its engine process decodes with the kept tokenizer less its merges, and takes them to encode
        assert (folder / "decoding.json").exists()
        assert await answer(second, CONSTRAINED) == constrained and constrained[0][0].isupper()
    finally:
        second.shutdown()


def test_a_kept_tokenizer_this_side_cannot_build_fails_the_load_naming_it(default_gguf, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    gguf_file.config_and_tokenizer(gguf_file.Path(default_gguf))  # kept, as a load keeps it

    def broken(folder):
        raise ValueError("a torn tokenizer.json")
    monkeypatch.setattr(gguf_file, "saved_tokenizer", broken)
    started = []
    real_spawn = engine_process.spawn_core

    def spawn():
        started.append(real_spawn())
        return started[-1]
    monkeypatch.setattr(engine_process, "spawn_core", spawn)
    with pytest.raises(RuntimeError, match=r"tokenizer kept in .*llm-stream/gguf.*a torn tokenizer\.json"):
        EngineProcess(EngineConfig(model=default_gguf))
    assert len(started) == 1 and started[0].process.wait(timeout=30) is not None


def test_the_kept_tokenizer_is_built_without_pytorch(default_gguf, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    gguf_file.config_and_tokenizer(gguf_file.Path(default_gguf))
    folder = gguf_file.kept_tokenizer(default_gguf)
    assert folder is not None
    code = ("import sys\nfrom engine.frontend.kept_tokenizer import KeptTokenizer\n"
            f"tokenizer = KeptTokenizer({default_gguf!r}).start().result()\n"
            f"print(tokenizer.name_or_path, 'torch' in sys.modules, tokenizer({PROMPT!r})['input_ids'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout
    name, torch_loaded, ids = out.strip().split(" ", 2)
    assert (name, torch_loaded) == (str(folder), "False")
    assert ids == str(gguf_file.saved_tokenizer(folder)(PROMPT)["input_ids"])
