"""python -m benchmarks folder: a Hugging Face folder served as it is given, against the same
weights as a GGUF file that llama.cpp's tools made.

    python -m benchmarks folder [--model llama-1b] [--quant Q8_0] [--out DIR]

The folder is a sized model's fp16 safetensors (`python -m benchmarks sized-models`), served by
`make serve`'s Flow with its defaults, which quantize it at load (`quant: auto`, q8_0; with
`--quant Q4_0`, LLM_QUANT=q4_0). The file is
the same folder converted by the pinned llama.cpp's `convert_hf_to_gguf.py` and quantized by its
`llama-quantize` to `--quant`. Three fresh servers, one after the other:
- the folder's first start, with an empty quantization cache (it quantizes and keeps the blocks);
- the folder's second start, from that cache;
- the GGUF file.
Each: seconds from the start command to ready, one stream and sixteen (sizes.py's workload), the
cold prompt and the peak memory of every process.

Then every quantized tensor the first start kept is compared with the GGUF's tensor of the same
weights, byte for byte (the GGUF's q and k rows in llama.cpp's order, put back in transformers'),
and the folder is written as a GGUF file here (`python -m engine.quantize`), whose every tensor is
compared with llama.cpp's file's, by name.
"""
import argparse
import asyncio
import os
import shutil
from pathlib import Path
from typing import Optional

import numpy as np

from testing.procs import ROOT

from ..harness.report import write_results
from ..harness.sized_models import CACHE, folder, gguf
from .sizes import head, measure, ratio

SERVED = ("folder, first start", "folder, second start", "gguf")


def same_blocks(cache: Path, file: Path) -> dict:
    """How many of the GGUF's quantized tensors equal, byte for byte, the blocks the folder's first
    start kept for the same weight; those that differ, by name."""
    from transformers import AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    from engine.model import gguf_file, gguf_native, quant_cache
    [entry] = [p for p in cache.iterdir() if p.is_dir()]
    index = quant_cache.entry(cache, entry.name)
    assert index is not None
    kept = {stored.name: stored for stored in quant_cache.read(index) if stored.kind != "F32"}
    header = gguf_file.read(file)
    config, _ = gguf_file.config_and_tokenizer(file, header.metadata_end)
    with no_init_weights():
        model = AutoModelForCausalLM.from_config(config)
    processor, names = gguf_native.mapping(model, header, config)
    equal, differ = 0, []
    for tensor in header.tensors:
        target, order = gguf_native.target_of(processor, tensor, names)
        if target not in kept or order is None:
            continue
        ours = kept[target]
        if ours.kind == tensor.tensor_type.name and np.array_equal(np.asarray(tensor.data)[order], ours.data):
            equal += 1
        else:
            differ.append(tensor.name)
    return {"equal": equal, "differ": differ, "kept": len(kept)}


def same_files(ours: Path, theirs: Path) -> dict:
    """How many tensors of two GGUF files are equal (type and bytes), by name; those that are not."""
    from engine.model import gguf_file
    mine = {t.name: t for t in gguf_file.read(ours).tensors}
    other = {t.name: t for t in gguf_file.read(theirs).tensors}
    equal = [n for n in mine if n in other and mine[n].tensor_type == other[n].tensor_type
             and np.array_equal(np.asarray(mine[n].data), np.asarray(other[n].data))]
    return {"equal": len(equal), "differ": sorted(set(mine) ^ set(other) | (set(mine) & set(other)) - set(equal))}


def table(result: dict) -> str:
    rows = result["rows"]
    base = rows["gguf"]
    lines = [f"# A Hugging Face folder against its {result['quant']} GGUF ({result['cpu']})", "",
             f"{result['date']}, git {result['git']}, `{result['command']}`; {result['model']}. Each cell: "
             f"the figure, and its ratio to the GGUF's.", "",
             "| served | ready, s | one stream, tok/s | sixteen streams, tok/s | cold prompt, prompt tok/s "
             "| peak memory, GB |", "|---|---|---|---|---|---|"]
    for name in SERVED:
        row = rows.get(name)
        if row is None:
            continue
        cells = [f"{row.get(k)} ({ratio(row.get(k), base.get(k))})" for k in
                 ("ready_s", "c1_tok_s", "c16_tok_s", "cold_prompt_tok_s", "peak_rss_gb")]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    blocks = result["blocks"]
    lines += ["", f"Of the {blocks['kept']} tensors the folder's first start quantized, {blocks['equal']} equal the "
              f"GGUF's byte for byte" + (f"; these differ: {', '.join(blocks['differ'])}" if blocks["differ"] else ".")]
    written = result["written"]
    lines += [f"The folder written as a GGUF file here (`python -m engine.quantize`): {written['equal']} tensors equal "
              f"llama.cpp's file's" + (f"; these differ: {', '.join(written['differ'])}" if written["differ"] else ".")]
    return "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks folder", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="llama-1b", help="a sized model's name (harness/sized_models.py)")
    p.add_argument("--quant", default="Q8_0", choices=("Q8_0", "Q4_K_M", "Q4_0"),
                   help="the GGUF file's type, and the folder's (LLM_QUANT)")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--one-stream-requests", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "folder")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    source, file = folder(args.model), gguf(args.model, args.quant)
    cache = CACHE / "quant-cache"  # the servers' LLM_QUANT_CACHE: emptied first, so the first start quantizes
    shutil.rmtree(cache, ignore_errors=True)
    os.environ["LLM_QUANT_CACHE"] = str(cache)
    result = head("folder", argv, model=args.model, quant=args.quant, rows={})
    for name, served in zip(SERVED, (source, source, file), strict=True):
        print(f"{name}: {served}", flush=True)
        if served == source:
            os.environ["LLM_QUANT"] = args.quant.lower()  # the default for Q8_0; a GGUF takes none
        else:
            os.environ.pop("LLM_QUANT", None)
        result["rows"][name] = asyncio.run(measure("this", served, args))
    result["blocks"] = same_blocks(cache, file)
    from engine.model.to_gguf import write
    result["written"] = same_files(write(str(source), args.out / f"{args.model}-written.gguf", args.quant.lower()), file)
    write_results(args.out, table(result), result)
    return 0
