"""Where a decode step's GPU time goes: transformers' forward alone, then EngineCore, at
batch 1, 16 and 64, twice in one process (round 0 meets every key length for the first
time, round 1 meets them again).

    python3 docs/benchmarks/2026-11-gpu/cudnn/repro/diag.py gpt2-small [--cudnn-sdp]

--cudnn-sdp turns cuDNN attention back on after the load (the engine turns it off on CUDA)
to show what it costs.
"""
import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

import torch
from transformers import DynamicCache

sys.path.insert(0, str(Path(__file__).resolve().parents[5]))
from benchmarks.models import ensure_model  # noqa: E402
from contract import EngineConfig, SamplingParams  # noqa: E402
from executors.engine.core import EngineCore  # noqa: E402
from executors.engine.loader import LoadedModel, load_model  # noqa: E402
from executors.engine.prepare import Prepared  # noqa: E402


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


@torch.inference_mode()
def hf_ms_per_step(loaded: LoadedModel, rows: int, steps: int = 64) -> float:
    ids = torch.randint(0, 1000, (rows, 16), device=loaded.device)
    cache = DynamicCache()
    out = loaded.model(input_ids=ids, past_key_values=cache, use_cache=True)
    token = out.logits[:, -1].argmax(-1, keepdim=True)
    sync()
    start = time.perf_counter()
    for _ in range(steps):
        out = loaded.model(input_ids=token, past_key_values=cache, use_cache=True)
        token = out.logits[:, -1].argmax(-1, keepdim=True)
        token.tolist()
    sync()
    return (time.perf_counter() - start) / steps * 1000


def core_ms_per_step(core: EngineCore, rows: int, tokens: int = 64) -> float:
    for i in range(rows):
        prepared = Prepared(list(range(100 + i, 116 + i)), SamplingParams(max_tokens=tokens, ignore_eos=True), None)
        core.add(f"r{rows}-{i}-{time.monotonic_ns()}", prepared, lambda _: None)
    start, steps = time.perf_counter(), 0
    while core.has_work:
        core.step()
        steps += 1
    return (time.perf_counter() - start) / steps * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model", nargs="?", default="gpt2-small")
    parser.add_argument("--cudnn-sdp", action="store_true")
    args = parser.parse_args()
    config = EngineConfig(model=str(ensure_model(args.model)))
    loaded = load_model(config)
    if args.cudnn_sdp:
        torch.backends.cuda.enable_cudnn_sdp(True)
    print("device", loaded.device, "dtype", loaded.model.dtype, "threads", torch.get_num_threads())
    for round_ in range(2):
        for rows in (1, 16, 64):
            hf_ms_per_step(loaded, rows, 8)
            print(f"round {round_} hf forward+argmax bs={rows}: {hf_ms_per_step(loaded, rows):.2f} ms/step", flush=True)
    core = EngineCore(loaded, config)
    for round_ in range(2):
        for rows in (1, 16, 64):
            core_ms_per_step(core, rows, 8)
            print(f"round {round_} EngineCore bs={rows}: {core_ms_per_step(core, rows):.2f} ms/step", flush=True)
    profile = cProfile.Profile()
    profile.enable()
    core_ms_per_step(core, 1)
    profile.disable()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(12)
    print(text.getvalue())


if __name__ == "__main__":
    main()
