"""A GGUF served from its own blocks: every quantized Linear keeps the file's steps and scales
(gguf_types.py) and runs in quant_matmul.c; no fp32 copy of the model is made or written.

transformers would dequantize every tensor to fp32 first (96 s for Gemma 3 270M here). Here the
model is built empty from the config (gguf_file.py), and each tensor goes where transformers would
put it (the `gguf` package's name map, and transformers' per-architecture processor), as exact
int4/int8 layers for the quantized Linear weights, the embedding table as the file's blocks too
(gguf_embedding.py), and fp32 for the rest (norms, biases).

A processor may reorder a tensor's rows (Llama's q and k): that order is read by passing the
row numbers through it, and the blocks are reordered to match, which is exact. Q4_K, Q6_K, Q4_0,
Q4_1, Q5_0 and Q8_0 Linear weights go straight from the file's blocks into the kernels' layouts, in
one C pass (gguf_repack.c), a K-quant's scales as the file holds them where the products run on
AVX-512 (native.own_k_scales); the other types, and the embedding table, through `split`
(gguf_types.py). A tensor that a processor changes otherwise is dequantized and processed as
transformers does.
"""
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import gguf
import numpy as np
import torch
from torch import nn
from transformers import AutoModelForCausalLM, PreTrainedModel
from transformers.initialization import no_init_weights
from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor, get_gguf_hf_weights_map

from ..kernels import gguf_repack, native
from . import gguf_file
from .gguf_embedding import BlockRows
from .gguf_types import TYPES, Exact, Layout, split
from .int4 import Int4Linear, Int8Linear
from .placement import put

log = logging.getLogger(__name__)

ROPE_FREQS = "rope_freqs.weight"  # llama.cpp's per-frequency rotary factors (Llama 3's scaling)


def servable() -> bool:
    """Whether quantized tensors can be kept as blocks here (the C kernels are built)."""
    return native.int4_ready() and native.int8_ready()


def load(folder: str, name: str, on_tokenizer: Callable[[Any], None] = lambda tokenizer: None,
         decoding_from: Optional[str] = None) -> tuple[Any, Any, int]:
    """(tokenizer, model, its weights' count) with the file's quantized Linear weights kept as blocks;
    on_tokenizer has the tokenizer before the weights load; decoding_from: as
    gguf_file.config_and_tokenizer takes it."""
    path = Path(folder) / name
    header = gguf_file.read(path)
    config, tokenizer = gguf_file.config_and_tokenizer(path, header.metadata_end, decoding_from)
    on_tokenizer(tokenizer)
    with no_init_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _fill(model, header, config)
    parameters = sum(int(np.prod(t.data.shape[:-1])) * t.width for t in header.tensors)
    return tokenizer, model, parameters


def _names(model: PreTrainedModel, architecture: str, processor: TensorProcessor) -> dict[str, str]:
    """GGUF tensor name -> the model's parameter name: the `gguf` package's map, built once (where
    a name does not map so, transformers' own search, which builds it once per submodule)."""
    arch = next((key for key, value in gguf.MODEL_ARCH_NAMES.items() if value == architecture), None)
    if arch is not None:
        name_map = gguf.get_tensor_name_map(arch, model.config.get_text_config().num_hidden_layers)
        names = {}
        for hf_name in model.state_dict():
            base, _, suffix = hf_name.rpartition(".")
            gguf_name = name_map.get_name(base)
            if gguf_name is None:
                break
            names[f"{gguf_name}.{suffix}"] = hf_name
        else:
            return names
    return get_gguf_hf_weights_map(model, processor)


def mapping(model: PreTrainedModel, header: gguf_file.Header, config: Any) -> tuple[TensorProcessor, dict[str, str]]:
    """The processor transformers passes this file's tensors through, and the GGUF name -> parameter map."""
    architecture = str(header.metadata["general.architecture"])
    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=config.to_dict())
    return processor, _names(model, architecture, processor)


def _fill(model: PreTrainedModel, header: gguf_file.Header, config: Any) -> None:
    processor, names = mapping(model, header, config)
    wanted = set(model.state_dict())
    tied = bool(getattr(config, "tie_word_embeddings", False))
    kept = 0
    for tensor in header.tensors:
        if tensor.name == ROPE_FREQS:
            scale_rotary(model, np.asarray(tensor.data, dtype=np.float32))
            continue
        target, order = target_of(processor, tensor, names)
        if target is None:
            log.info("%s: not a weight of %s; skipped", tensor.name, type(model).__name__)
            continue
        exact = None
        if order is not None and repacked(model, target, tensor, order):
            kept += 1
        elif order is not None and keep(model, target, exact := _exact(tensor), order):
            kept += 1
        else:
            copy(model, target, _processed(processor, tensor, names))
        wanted.discard(target)
        if tied and target.endswith("embed_tokens.weight") and exact is not None:
            output = model.get_output_embeddings()
            for lm_name, module in model.named_modules():
                if module is output and (repacked(model, lm_name + ".weight", tensor, order)
                                         or keep(model, lm_name + ".weight", exact, order)):
                    wanted.discard(lm_name + ".weight")
    if tied:
        wanted = {n for n in wanted if not n.startswith("lm_head.")}
    if wanted:
        raise ValueError(f"the GGUF lacks weights the config asks for: {sorted(wanted)[:5]}")
    log.info("GGUF: %d quantized layers kept as the file's blocks", kept)


def scale_rotary(model: PreTrainedModel, factors: np.ndarray) -> None:
    """The file's rotary frequency factors (`rope_freqs`: Llama 3.1's and 3.2's long-context
    scaling, which llama.cpp's converter writes as one factor per frequency): each rotary
    embedding's frequencies divided by them, as llama.cpp divides them. transformers' GGUF reader
    leaves this tensor out, and the model would turn its queries and keys by unscaled angles."""
    scaled = 0
    for module in model.modules():
        for name in ("inv_freq", "original_inv_freq"):
            frequencies = getattr(module, name, None)
            if isinstance(frequencies, torch.Tensor) and frequencies.shape == factors.shape:
                frequencies.div_(torch.from_numpy(factors).to(frequencies.dtype))
                scaled += name == "inv_freq"
    if not scaled:
        raise ValueError(f"{ROPE_FREQS}: {factors.shape[0]} rotary factors, and no rotary embedding of "
                         f"{type(model).__name__} has that many frequencies")
    log.info("rotary frequencies divided by the file's %s (%d factors)", ROPE_FREQS, factors.shape[0])


def target_of(processor: TensorProcessor, tensor: gguf_file.Tensor, names: dict[str, str]) -> tuple[Optional[str], Optional[np.ndarray]]:
    """The parameter a tensor fills, and the order its rows take there (None: not a plain
    reordering, or not a 2-D quantized tensor)."""
    if tensor.tensor_type not in TYPES or len(tensor.data.shape) != 2:
        result = processor.process(weights=np.zeros(1, np.float32), name=tensor.name, tensor_key_mapping=names,
                                   parsed_parameters={"tensors": {}})
        return names.get(result.name), None
    rows = tensor.data.shape[0]
    probe = np.arange(rows, dtype=np.float32)[:, None]
    result = processor.process(weights=probe.copy(), name=tensor.name, tensor_key_mapping=names,
                               parsed_parameters={"tensors": {}})
    moved = np.asarray(result.weights)
    if moved.shape != probe.shape or not np.array_equal(np.sort(moved[:, 0]), probe[:, 0]):
        return names.get(result.name), None
    return names.get(result.name), moved[:, 0].astype(np.int64)


def reordering(order: Optional[np.ndarray]) -> Optional[np.ndarray]:
    """target_of's order, or None where every row stays where it is (most tensors): no copy then."""
    return None if order is None or np.array_equal(order, np.arange(len(order))) else order


def _exact(tensor: gguf_file.Tensor) -> Exact:
    return split(tensor.data, tensor.tensor_type, tensor.width)


def servable_linear(model: PreTrainedModel, target: str) -> Optional[nn.Linear]:
    """The plain Linear whose weight `target` names, where the C products can serve it (kernels built,
    outputs a multiple of their 16-row groups); None otherwise."""
    module_name, _, leaf = target.rpartition(".")
    module = model.get_submodule(module_name)
    if type(module) is not nn.Linear or leaf != "weight" or not servable() or module.out_features % 16:
        return None
    return module


def repacked(model: PreTrainedModel, target: str, tensor: gguf_file.Tensor, order: Optional[np.ndarray]) -> bool:
    """`keep` for a Linear weight of a type gguf_repack.c takes, its blocks written into the kernels'
    layout in one pass (the same buffers as `keep` makes of `split`, a test compares them). False
    for other types and modules (the caller splits and keeps)."""
    kind = tensor.tensor_type.name
    module = servable_linear(model, target) if kind in gguf_repack.BLOCK else None
    if module is None:
        return False
    buffers = gguf_repack.repack(kind, tensor.data, reordering(order), module.out_features,
                                 module.in_features, own_scales=native.own_k_scales())
    if buffers is None:
        return False
    layer = Int4Linear.of_packed(module, *buffers) if kind in gguf_repack.INT4 else Int8Linear.of_packed(module, *buffers)
    put(model, target.rpartition(".")[0], layer)
    return True


def keep(model: PreTrainedModel, target: str, exact: Exact, order: Optional[np.ndarray]) -> bool:
    """Put `exact` where `target` is: a Linear becomes an int4/int8 layer of the file's blocks; an
    Embedding gets its fp32 weights. False where it does not fit (the caller dequantizes)."""
    module_name, _, leaf = target.rpartition(".")
    module = model.get_submodule(module_name)
    order = reordering(order)
    rows = (lambda a: a) if order is None else (lambda a: a[order])
    if isinstance(module, nn.Embedding) and leaf == "weight":
        put(model, module_name, BlockRows(module, exact, None if order is None else torch.from_numpy(order)))
        return True
    linear = servable_linear(model, target)
    if linear is None:
        return False
    steps, scale = torch.from_numpy(rows(exact.steps)), torch.from_numpy(rows(exact.scale))
    low = None if exact.low is None else torch.from_numpy(rows(exact.low))
    if exact.layout in (Layout.INT4, Layout.INT4_F32):
        assert low is not None
        wide = exact.layout is Layout.INT4_F32
        layer: nn.Module = Int4Linear(linear, steps, scale.float() if wide else scale.half(),
                                      low.float() if wide else low.half(), wide=wide)
    else:
        fp16 = exact.layout is Layout.Q8_0
        layer = Int8Linear(linear, (steps, scale.half() if fp16 else scale.float(), low))
    put(model, module_name, layer)
    return True


def _processed(processor: TensorProcessor, tensor: gguf_file.Tensor, names: dict[str, str]) -> torch.Tensor:
    data = gguf.dequantize(tensor.data, tensor.tensor_type)
    result = processor.process(weights=data, name=tensor.name, tensor_key_mapping=names,
                               parsed_parameters={"tensors": {}})
    return torch.from_numpy(np.array(result.weights, dtype=np.float32))


def copy(model: PreTrainedModel, target: str, values: torch.Tensor) -> None:
    module_name, _, leaf = target.rpartition(".")
    parameter = getattr(model.get_submodule(module_name), leaf)  # a parameter or a buffer
    if parameter.shape != values.shape:
        values = values.reshape(parameter.shape)
    with torch.no_grad():
        parameter.copy_(values)
