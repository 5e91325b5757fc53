"""Models of the sizes people serve (1B to 8B), with random weights, for the speed benchmarks.

No real weights of that size can be fetched here, and random weights measure speed honestly: a
decode step reads every weight whatever their values. Quality stays measured on the real small
models. Each shape is a real model's layers (Llama 3.2 1B and 3B, Llama 3.1 8B, Qwen 2.5 1.5B,
Gemma 3 1B) over SmolLM2's tokenizer, whose vocabulary (49,152) the converter knows; `llama-1b` is thus the
1.17B model of the published 1B figures. Its weights are drawn with a seed of their own per
tensor, so a folder is the same bytes wherever it is made, and written as fp16 safetensors one
shard at a time (an 8B never sits whole in memory).

The special tokens' output rows are zero: a random model's greedy step would otherwise end a
request early on EOS, and every request must run its full length.

`gguf(name, quant)` converts the folder with the pinned llama.cpp's own `convert_hf_to_gguf.py`
(`make llama-cpp` unpacks it) and quantizes that with its `llama-quantize`: the files that both
servers are measured on. Everything is made on demand under `benchmarks/.models/sized`, never
committed.
"""
import argparse
import hashlib
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional

import torch

from .. import HERE
from ..peers import llama_cpp

CACHE = HERE / ".models" / "sized"
TOKENIZER = HERE.parent / "models" / "SmolLM2-135M-Instruct"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
QUANTS = ("Q4_K_M", "Q4_0", "Q8_0")
SHARD_BYTES = 2 << 30
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "gemma3_text": "Gemma3ForCausalLM"}
STD = 0.02  # transformers' initializer range


@dataclass(frozen=True)
class Shape:
    """A decoder's sizes, as its family's transformers config names them."""

    family: str  # a transformers model_type: llama, qwen2, gemma3_text
    hidden: int
    layers: int
    intermediate: int
    heads: int
    kv_heads: int
    tied: bool  # the output layer is the embeddings
    rope_theta: float  # 0: the family's own (Gemma 3's local and global bases)
    about: str
    head_dim: int = 0  # 0: hidden / heads
    window: int = 0  # the sliding window of the family's windowed layers (0: none, or the family's own)

    @property
    def norm(self) -> float:
        """What a norm's weights hold: 1, or 0 where the family scales by 1 + w (Gemma)."""
        return 0.0 if self.family.startswith("gemma") else 1.0


SHAPES = {
    "llama-1b": Shape("llama", 2048, 16, 8192, 32, 8, False, 500000.0,
                      "Llama 3.2 1B's layers, output untied: 1.17B parameters"),
    "llama-3b": Shape("llama", 3072, 28, 8192, 24, 8, False, 500000.0, "Llama 3.2 3B's layers"),
    "llama-8b": Shape("llama", 4096, 32, 14336, 32, 8, False, 500000.0, "Llama 3.1 8B's layers"),
    "qwen2.5-1.5b": Shape("qwen2", 1536, 28, 8960, 12, 2, True, 1000000.0,
                          "Qwen 2.5 1.5B's layers: q, k and v with biases"),
    "gemma3-1b": Shape("gemma3_text", 1152, 26, 6912, 4, 1, True, 0.0,
                       "Gemma 3 1B's layers: heads of 256, q and k normed, 5 of 6 layers in a window of 512",
                       head_dim=256, window=512),
}


def config(shape: Shape, vocab: int, bos: int, eos: int) -> Any:
    """The transformers config of the shape, fp16, over a vocabulary of `vocab`."""
    from transformers import AutoConfig
    own: dict[str, Any] = {"rope_theta": shape.rope_theta, "rms_norm_eps": 1e-5} if shape.rope_theta else {}
    if shape.head_dim:
        own["head_dim"] = shape.head_dim
    if shape.window:
        own["sliding_window"] = shape.window
    return AutoConfig.for_model(
        shape.family, vocab_size=vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers, num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
        max_position_embeddings=8192, tie_word_embeddings=shape.tied, bos_token_id=bos, eos_token_id=eos,
        torch_dtype="float16", architectures=[ARCHITECTURES[shape.family]], **own)  # the converter reads the family by its architecture


def tensors(cfg: Any) -> list[tuple[str, tuple[int, ...]]]:
    """Every weight's name and shape, as the family's model holds them (made on the meta device:
    no memory)."""
    from transformers import AutoModelForCausalLM
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    return [(name, tuple(p.shape)) for name, p in model.state_dict().items()
            if not (cfg.tie_word_embeddings and name == "lm_head.weight")]


def draw(name: str, shape: tuple[int, ...], special: list[int], norm: float = 1.0) -> torch.Tensor:
    """One weight, fp16, from a seed of its own (the name's hash): norms are `norm` (Shape.norm),
    the rest normal(0, 0.02); the special tokens' output rows are zero (the embeddings', where tied)."""
    if name.endswith("norm.weight"):
        return torch.full(shape, norm, dtype=torch.float16)
    seed = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little") & (2**63 - 1)
    values = torch.empty(shape, dtype=torch.float32).normal_(0.0, STD, generator=torch.Generator().manual_seed(seed))
    if name in ("lm_head.weight", "model.embed_tokens.weight") and special:
        values[special] = 0.0
    return values.to(torch.float16)


def _shards(names: list[tuple[str, tuple[int, ...]]]) -> Iterator[list[tuple[str, tuple[int, ...]]]]:
    shard: list[tuple[str, tuple[int, ...]]] = []
    size = 0
    for name, shape in names:
        nbytes = 2 * int(torch.Size(shape).numel())
        if shard and size + nbytes > SHARD_BYTES:
            yield shard
            shard, size = [], 0
        shard.append((name, shape))
        size += nbytes
    if shard:
        yield shard


def write_folder(shape: Shape, folder: Path) -> None:
    """The model as a Hugging Face folder: config, SmolLM2's tokenizer, fp16 safetensors shards."""
    from safetensors.torch import save_file
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)
    cfg = config(shape, len(tokenizer), tokenizer.bos_token_id, tokenizer.eos_token_id)
    folder.mkdir(parents=True, exist_ok=True)
    cfg.save_pretrained(folder)
    for name in TOKENIZER_FILES:
        if (TOKENIZER / name).exists():
            shutil.copy(TOKENIZER / name, folder / name)
    special = sorted(set(tokenizer.all_special_ids))
    shards = list(_shards(tensors(cfg)))
    index: dict[str, str] = {}
    for i, shard in enumerate(shards, 1):
        file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file({name: draw(name, dims, special, shape.norm) for name, dims in shard}, str(folder / file),
                  metadata={"format": "pt"})
        index.update(dict.fromkeys((name for name, _ in shard), file))
    total = sum(2 * int(torch.Size(dims).numel()) for shard in shards for _, dims in shard)
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": index}, indent=1))


SHAPE_FILE = "shape.json"  # the Shape a folder was made from


def _drop_ggufs(name: str, cache: Path) -> None:
    """The named model's GGUF files, made from a shape it no longer has"""
    for stale in cache.glob(f"{name}-*.gguf"):
        stale.unlink()


def _made_from(path: Path) -> dict | None:
    """The Shape fields a folder records (None: it records none, made before they were kept)."""
    file = path / SHAPE_FILE
    return json.loads(file.read_text()) if file.exists() else None


def folder(name: str, cache: Path = CACHE) -> Path:
    """The named model's Hugging Face folder, made (atomically) the first time, and made again, its
    GGUF files with it, where the folder records another shape than SHAPES's (a shape changed)."""
    if name not in SHAPES:
        raise ValueError(f"unknown model {name!r}; choose from {', '.join(SHAPES)}")
    path, shape = cache / name, asdict(SHAPES[name])
    if (path / "model.safetensors.index.json").exists():
        if _made_from(path) in (None, shape):
            return path
        _drop_ggufs(name, cache)
    building = cache / f".{name}.building"
    shutil.rmtree(building, ignore_errors=True)
    write_folder(SHAPES[name], building)
    (building / SHAPE_FILE).write_text(json.dumps(shape, indent=1))
    shutil.rmtree(path, ignore_errors=True)
    building.rename(path)
    return path


# The converter, run with SmolLM2's tokenizer read as its file has it whatever the family:
# transformers' AutoTokenizer takes a family's own class by its model_type (Qwen2Tokenizer for
# qwen2), which rebuilds the pipeline with that family's pre-tokenizer, and the converter then
# recognizes no pre-tokenizer it knows and stops (the llama family's is the file's as it is).
CONVERT = """
import os, runpy, sys
from transformers.models.auto import tokenization_auto
tokenization_auto.TOKENIZER_MAPPING_NAMES["qwen2"] = "TokenizersBackend"
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(sys.argv[0]))  # as running the script puts its folder first
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def _lean_record(name: str, cache: Path) -> Path:
    """Where a model made `lean` records its Shape, its folder gone"""
    return cache / f"{name}.{SHAPE_FILE}"


def model_parser(prog: str, doc: str, out: Path) -> argparse.ArgumentParser:
    """A benchmark's options for one GGUF file (default: the sized 1.17B Q4_K_M, made on demand)
    and its results folder, described by its module's first paragraph; `model_file` reads the first."""
    parser = argparse.ArgumentParser(prog=prog, description=" ".join(doc.split("\n\n")[0].split()))
    parser.add_argument("--model", type=Path, default=None, help="a GGUF file (default: the sized 1.17B Q4_K_M)")
    parser.add_argument("--out", type=Path, default=out)
    return parser


def model_file(model: Optional[Path]) -> Path:
    return model or gguf("llama-1b", "Q4_K_M")


def gguf(name: str, quant: str, cache: Path = CACHE, lean: bool = False) -> Path:
    """The named model as a GGUF file of `quant` (QUANTS, or F16): converted by the pinned
    llama.cpp's converter, quantized by its llama-quantize; each made once. `lean`: the folder and
    the F16 file are deleted as soon as they are used (an 8B's come to 32 GB beside its 5 GB
    Q4_K_M); the Shape they were made from is kept beside the file instead."""
    if quant not in (*QUANTS, "F16"):
        raise ValueError(f"unknown quantization {quant!r}; choose from {', '.join((*QUANTS, 'F16'))}")
    target, record, shape = cache / f"{name}-{quant}.gguf", _lean_record(name, cache), asdict(SHAPES[name])
    if target.exists() and not (cache / name).exists() and record.exists():
        if json.loads(record.read_text()) == shape:
            return target
        _drop_ggufs(name, cache)  # made lean from another shape
    record.unlink(missing_ok=True)
    source_folder = folder(name, cache)  # first: a changed shape's files go with its old folder
    if target.exists():
        return target
    f16 = cache / f"{name}-F16.gguf"
    if not f16.exists():
        source = llama_cpp.source()
        partial = f16.with_suffix(".partial")
        # its own gguf-py, and sentencepiece, which the converter imports and .venv does not pin
        env = {"PYTHONPATH": f"{source / 'gguf-py'}:{llama_cpp.DEPS}", "PATH": "/usr/bin:/bin"}
        subprocess.run([sys.executable, "-c", CONVERT, str(source / "convert_hf_to_gguf.py"), str(source_folder),
                        "--outtype", "f16", "--outfile", str(partial)], check=True, env=env)
        partial.rename(f16)
    if lean:
        record.write_text(json.dumps(shape, indent=1))
        shutil.rmtree(source_folder)
    if quant != "F16":
        llama_cpp.quantize(f16, target, quant)
        if lean:
            f16.unlink()
    return target


def main(argv: list[str] | None = None) -> int:
    import argparse
    p = argparse.ArgumentParser(prog="python -m benchmarks sized-models", description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="*", default=["llama-1b"], help=f"of {', '.join(SHAPES)} (default: llama-1b)")
    p.add_argument("--quant", action="append", choices=(*QUANTS, "F16"),
                   help="GGUF files to make too (repeatable; none: the folder only)")
    p.add_argument("--lean", action="store_true",
                   help="keep only the GGUF files asked for: the folder and the F16 file are deleted once used")
    args = p.parse_args(argv)
    for name in args.models:
        if not args.lean:
            print(f"{name}: {SHAPES[name].about}: {folder(name)}", flush=True)
        for quant in args.quant or []:
            print(f"{name} {quant}: {gguf(name, quant, lean=args.lean)}", flush=True)
    return 0
