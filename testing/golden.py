"""The golden file (tests/golden/cpu.json): greedy answers with each token's exact log probability
and its top 5 alternatives', as the C kernels' one arithmetic (engine/kernels/arith.h) computes
them. Every CPU must reproduce it bit for bit, on every kernel path it can build (the machine's
own, AVX2, plain C), so each machine that runs `make test` checks the others' bits.

`LLM_WRITE_GOLDEN=1` writes what this machine computes instead of comparing (after a change that
is meant to change the numbers).
"""
import asyncio
import ctypes
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from contract import SamplingParams
from engine.frontend.async_engine import EngineClient
from engine.kernels import build
from engine.torch_vectors import cpu_flags

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden" / "cpu.json"
WRITE = os.environ.get("LLM_WRITE_GOLDEN") == "1"
TOP = 5
MAX_TOKENS = 24

# the default model's chat questions; the first is the README's
QUESTIONS = ["What is the capital of France?", "What is 2 + 2?", "Name three primary colors.",
             "Write a haiku about the sea.", "Who wrote Romeo and Juliet?", "What is the boiling point of water?",
             "Translate 'good morning' into Spanish.", "Give me a synonym for happy.",
             "What is the largest planet in the solar system?", "How many days are in a week?",
             "Explain photosynthesis in one sentence.", "What does a CPU do?"]
# the tiny test models' plain prompts (their vocabulary's words)
PROMPTS = ["the quick brown fox", "a lazy dog sleeps", "streams of tokens flow", "the", "over the hill and far away",
           "tokens", "quick quick quick", "a dog and a fox", "flow over the lazy hill", "far away streams",
           "brown", "the dog jumps over the fox while the streams flow"]


async def record(engine: EngineClient, prompts: list[str], chat: bool) -> list[dict[str, Any]]:
    """Each prompt's greedy answer (MAX_TOKENS at most), run together: tokens, text, each token's
    log probability and its TOP alternatives (id, log probability)."""
    async def one(prompt: str) -> dict[str, Any]:
        params = SamplingParams(max_tokens=MAX_TOKENS, logprobs=True, top_logprobs=TOP)
        messages = [{"role": "user", "content": prompt}] if chat else None
        outs = await engine.complete("" if chat else prompt, params, messages)
        return {"prompt": prompt, "text": "".join(t for o in outs for t in o.texts),
                "tokens": [t for o in outs for t in o.token_ids],
                "logprobs": [lp for o in outs for lp in o.logprobs],
                "top": [[[i, lp] for i, _, lp in alts] for o in outs for alts in o.alternatives]}
    return list(await asyncio.gather(*(one(p) for p in prompts)))


def expected(section: str) -> list[dict[str, Any]]:
    return list(json.loads(GOLDEN.read_text())[section])


def check(section: str, got: list[dict[str, Any]], path: str) -> None:
    """`got` against the golden file's `section`, bit for bit (or written there, with
    LLM_WRITE_GOLDEN=1 on the machine's own path); the first difference is named."""
    if WRITE and path == "native":
        golden = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
        golden[section] = got
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(json.dumps(golden, indent=1, sort_keys=True, ensure_ascii=False) + "\n")
        return
    for want, have in zip(expected(section), got, strict=True):
        for key in ("tokens", "logprobs", "top", "text"):
            assert have[key] == want[key], (
                f"{section}, kernel path {path}: {want['prompt']!r}'s {key} differ from the golden file "
                f"({GOLDEN.relative_to(ROOT)}):\n  golden {want[key]}\n  here   {have[key]}")


def kernel_paths() -> dict[str, tuple[str, ...]]:
    """The kernel paths this CPU runs, by name: the machine's own, AVX-512 without VNNI where it
    has VNNI (quant_tiles512.h's other product), AVX2 where it has AVX-512 too, and plain C
    (build.PORTABLE), each as its LLM_KERNEL_FLAGS."""
    flags = cpu_flags()
    paths: dict[str, tuple[str, ...]] = {"native": ()}
    if {"avx512_vnni", "avx512bw"} <= flags:
        paths["avx512bw"] = ("-mno-avx512vnni",)
    if "avx512f" in flags:
        paths["avx2"] = ("-mno-avx512f",)
    if "avx" in flags:
        paths["portable"] = tuple(build.PORTABLE.split())
    return paths


def build_paths() -> dict[str, ctypes.CDLL]:
    """Each path's library: the engine's own for "native", the others built (or taken from the
    kernel cache) with their flags."""
    own = build.library()
    if own is None:
        return {}
    return {name: build.library_with(flags) if flags else own for name, flags in kernel_paths().items()}


async def check_path(path: str, libraries: dict[str, ctypes.CDLL], make_engine: Callable[..., Any], model: str,
                     section: str, prompts: list[str], chat: bool, alone_too: bool = False) -> None:
    """An engine on `model` running `path`'s kernels answers `prompts` as `section` of the golden
    file holds them (int4 weights, an fp16 KV cache: what the one arithmetic covers); alone_too:
    the first prompt, asked alone after, gets the answer it got batched with the others."""
    import pytest
    if path not in libraries:
        pytest.skip(f"the {path} path is not built here")
    with kernels(libraries[path]):
        engine = make_engine(model, device="cpu")
        assert engine.info.dtype == "int4" and engine.info.kv_cache_dtype == "float16"
        assert build.library() is libraries[path]  # the path's kernels run every step
        got = await record(engine, prompts, chat)
        assert all(len(answer["top"]) == len(answer["tokens"]) > 0 for answer in got)
        check(section, got, path)
        if alone_too:
            assert await record(engine, prompts[:1], chat) == got[:1]


@contextmanager
def kernels(library: ctypes.CDLL) -> Iterator[None]:
    """Engines made inside run `library`'s kernels (a path's), as if this machine had built it."""
    real = build._built
    build._built = lambda: (library, "")  # type: ignore[assignment]
    try:
        yield
    finally:
        build._built = real
