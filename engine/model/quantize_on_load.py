"""A Hugging Face folder served as a GGUF of the same weights would be: its Linear weights and token
embeddings are quantized at load (`quant`, $LLM_QUANT) into GGML blocks, then kept and multiplied
as a GGUF file's blocks are (gguf_native.keep): the same C kernels, the same bits on every path.

Why: a folder of bf16 or fp16 weights ran here in fp32, reading four bytes per weight each token:
a 1.17B Llama-shaped folder made a quarter of its Q8_0 GGUF's speed. Which type each weight gets,
and its quantizer, is quant_mix.py's: llama.cpp's choices and ggml's reference quantizers, so a
tensor's blocks are the ones llama.cpp's `llama-quantize` writes for that scheme.

`auto` is q8_0 for a folder of 16-bit weights on CPU, and none otherwise. Q8_0 is near-lossless (an
int8 step per weight, one fp16 scale per 32) and half the bytes of fp16; Hugging Face publishes
models as bf16 or fp16, so that is what a user's folder holds. A folder of fp32 weights was written
in fp32 on purpose (an export made to be exact, as the default model's, whose weights are 4-bit
already and run as int4): it is served as it is unless asked.

The first start writes the blocks to the cache (quant_cache.py); later starts build the model
empty from its config and place the cached blocks, as a GGUF's are placed, without reading the
folder's weights.
"""
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel
from transformers.initialization import no_init_weights

from contract import EngineConfig, ValidationError

from ..kernels import native
from . import gguf_native, quant_cache, quant_mix
from .gguf_types import split
from .quant_cache import Stored, weight_files
from .quant_mix import Names

log = logging.getLogger(__name__)

_SIXTEEN_BITS = ("F16", "BF16")
_PROGRESS_S = 10.0


def pick(config: EngineConfig, source: str, device: torch.device, is_gguf: bool) -> Optional[str]:
    """The scheme (quant_mix.SCHEMES) to quantize `source` in, None for none; a ValidationError
    naming `quant` for a scheme asked of a source or machine that cannot take it."""
    asked = config.quant
    if asked == "none":
        return None
    if asked != "auto":
        if is_gguf:
            raise ValidationError("quant", f"{source!r} is a GGUF file, served in its own types; "
                                           "quant applies to a Hugging Face folder")
        if device.type != "cpu":
            raise ValidationError("quant", f"{asked} runs on CPU only, not {device.type}")
        if config.dtype != "auto":
            raise ValidationError("quant", f"{asked} quantizes the weights; it does not go with dtype {config.dtype}")
        if not gguf_native.servable():
            raise ValidationError("quant", f"{asked} needs the C kernels, which could not be built here")
        if not weight_files(Path(source)):
            raise ValidationError("quant", f"{source!r} is no folder of .safetensors weights to quantize")
        return asked
    wanted = (not is_gguf and device.type == "cpu" and config.dtype == "auto" and gguf_native.servable()
              and _sixteen_bit(Path(source)))
    return "q8_0" if wanted else None


def _sixteen_bit(folder: Path) -> bool:
    """Whether the folder's largest weights are bf16 or fp16 (its first file's first matrix)."""
    files = weight_files(folder)
    if not files:
        return False
    with safe_open(files[0], framework="pt") as f:
        for name in f.keys():
            piece = f.get_slice(name)
            if len(piece.get_shape()) == 2:
                return bool(piece.get_dtype() in _SIXTEEN_BITS)
    return False


def load(source: str, scheme: str, trust_remote_code: bool,
         on_tokenizer: Callable[[Any], None] = lambda tokenizer: None) -> tuple[Any, PreTrainedModel, int]:
    """(tokenizer, model, its weights' count) with the folder's weights as `scheme`'s blocks: from the
    cache where this folder was quantized before, else quantized now and kept; on_tokenizer has the
    tokenizer before the weights load."""
    folder = Path(source)
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=trust_remote_code)
    on_tokenizer(tokenizer)
    model = _skeleton(folder, trust_remote_code)
    cache = quant_cache.root()
    name = quant_cache.key(folder, weight_files(folder), scheme, cache)
    index = quant_cache.entry(cache, name)
    if index is not None:
        started = time.perf_counter()
        _fill(model, quant_cache.read(index))
        log.info("%s: its %s blocks read from the cache (%s) in %.1f s", folder.name, scheme,
                 index["folder"], time.perf_counter() - started)
        return tokenizer, model, int(index["meta"]["parameters"])
    writer = None if cache is None else quant_cache.Writer(cache, name, {"source": str(folder.resolve())})
    try:
        parameters = _fill(model, _quantized(folder, model, scheme, writer, trust_remote_code))
        if writer is not None:
            writer.index["meta"]["parameters"] = parameters
            writer.commit()
    except BaseException:
        if writer is not None:
            writer.discard()
        raise
    return tokenizer, model, parameters


def blocks(source: str, scheme: str, trust_remote_code: bool, cache: Path) -> dict[str, Any]:
    """The cache entry of the folder's weights as `scheme`'s blocks (its index), quantized into `cache`
    first where it is not there; no model is filled (what writing a GGUF file needs)."""
    folder = Path(source)
    name = quant_cache.key(folder, weight_files(folder), scheme, cache)
    index = quant_cache.entry(cache, name)
    if index is None:
        writer = quant_cache.Writer(cache, name, {"source": str(folder.resolve())})
        try:
            tensors = _quantized(folder, _skeleton(folder, trust_remote_code), scheme, writer, trust_remote_code)
            writer.index["meta"]["parameters"] = sum(_elements(stored) for stored in tensors)
            writer.commit()
        except BaseException:
            writer.discard()
            raise
        index = quant_cache.entry(cache, name)
        assert index is not None, "the entry was just written"
    return index


def _skeleton(folder: Path, trust_remote_code: bool) -> PreTrainedModel:
    """The folder's model built from its config in fp32, its memory not yet written (no
    initialization): every weight is placed from the blocks or values after."""
    config = AutoConfig.from_pretrained(folder, trust_remote_code=trust_remote_code)
    with no_init_weights():
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32, trust_remote_code=trust_remote_code)


def _elements(stored: Stored) -> int:
    """How many weights a stored tensor holds."""
    if stored.kind == "F32":
        return int(stored.data.size)
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[stored.kind]]
    return int(stored.data.size) // size * block


def _fill(model: PreTrainedModel, tensors: Iterator[Stored]) -> int:
    """Place every tensor: blocks as the engine's block layers (the output layer tied to the input
    embedding from the same blocks), values as fp32; returns the count of weights placed. Every
    weight of the model must be filled."""
    names = Names.of(model)
    wanted = set(model.state_dict()) - ({names.output} if names.tied else set())
    count = 0
    for stored in tensors:
        if stored.kind == "F32":
            gguf_native.copy(model, stored.name, torch.from_numpy(np.array(stored.data, dtype=np.float32)))
        else:
            kind = GGMLQuantizationType[stored.kind]
            block, size = GGML_QUANT_SIZES[kind]
            exact = split(stored.data, kind, stored.data.shape[1] // size * block)
            targets = [stored.name] + ([names.output] if names.tied and stored.name == names.input else [])
            for target in targets:
                if not gguf_native.keep(model, target, exact, None):
                    raise ValueError(f"{target}: its {stored.kind} blocks fit no layer of {type(model).__name__}")
        count += _elements(stored)
        wanted.discard(stored.name)
    if wanted:
        raise ValueError(f"the weights lack tensors the config asks for: {sorted(wanted)[:5]}")
    return count


def _quantized(folder: Path, model: PreTrainedModel, scheme: str,
               writer: Optional[quant_cache.Writer], trust_remote_code: bool) -> Iterator[Stored]:
    """The folder's tensors, those that `quant_mix.kinds` names as its blocks of their type, the rest
    as fp32; each one also goes to the cache's writer."""
    kinds, names = quant_mix.kinds(model, scheme, native.DENSE_CHANNELS), Names.of(model)
    source = _Source(folder, model, trust_remote_code)
    started = last = time.perf_counter()
    with quant_mix.workers() as pool:
        for done, (name, tensor) in enumerate(source, 1):
            if names.tied and name == names.output:
                continue  # the input embedding's blocks serve it
            values = tensor.float().numpy()
            kind = kinds.get(name)
            fits = kind is not None and values.shape[-1] % GGML_QUANT_SIZES[kind][0] == 0
            stored = Stored(name, kind.name, quant_mix.quantize(values, kind, pool)) if kind is not None and fits \
                else Stored(name, "F32", values)
            if writer is not None:
                writer.add(stored)
            yield stored
            if time.perf_counter() - last > _PROGRESS_S:
                last = time.perf_counter()
                log.info("quantizing %s to %s: %d of %d tensors, %.0f s", folder.name, scheme, done, len(source),
                         last - started)
    log.info("%s: quantized to %s in %.1f s%s", folder.name, scheme, time.perf_counter() - started,
             "" if writer is None else f"; kept in {writer.final}")


class _Source:
    """A folder's tensors by the model's own names, read one at a time from its safetensors files
    (mapped); where the files' names are not the model's (a checkpoint transformers renames on
    load), from a model transformers loads in the files' dtype."""

    def __init__(self, folder: Path, model: PreTrainedModel, trust_remote_code: bool):
        self.folder, self.trust_remote_code = folder, trust_remote_code
        self.files: dict[str, Path] = {}
        for path in weight_files(folder):
            with safe_open(path, framework="pt") as f:
                self.files.update({name: path for name in f.keys()})
        names = Names.of(model)
        expected = set(model.state_dict()) - ({names.output} if names.tied else set())
        self.direct = expected <= set(self.files) <= expected | {names.output}

    def __len__(self) -> int:
        return len(self.files)

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        if self.direct:
            for path in sorted(set(self.files.values())):
                with safe_open(path, framework="pt") as f:
                    for name in f.keys():
                        yield name, f.get_tensor(name)
            return
        log.info("%s: its tensors' names are not the model's; loading it through transformers first",
                 self.folder.name)
        loaded = AutoModelForCausalLM.from_pretrained(self.folder, dtype="auto",
                                                      trust_remote_code=self.trust_remote_code)
        yield from loaded.state_dict().items()
