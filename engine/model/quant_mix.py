"""Which GGML type each weight of a model gets under a `quant` scheme, as llama.cpp's
`llama-quantize` picks them (its llama_tensor_get_type), and the quantizer of each type.

- q8_0, q4_0, q4_1, q5_0: every Linear weight and the input embedding in that type; under the 4- and
  5-bit ones the output layer (and embeddings tied to it) in Q8_0, as llama.cpp keeps the output
  layer wider than the rest.
- q4_k_m: Q4_K, with Q6_K for the output layer (or the embeddings tied to it) and for the V and
  down projections of the layers `use_more_bits` names (the first and last eighth, and every
  third between); as llama.cpp's Q4_K_M preset mixes them.
- A K type on a row whose width is not a whole number of 256-weight blocks falls back as llama.cpp
  falls back: Q4_K to Q5_0, Q6_K to Q8_0.

The legacy types' quantizers are the `gguf` package's; Q4_K's and Q6_K's are k_quants.py's. A large
tensor is cut into row chunks quantized on every core (numpy leaves the lock while it works): each
row's blocks are its own, so the result is the same bytes.
"""
import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Optional

import numpy as np
from gguf import GGML_QUANT_SIZES, quants
from gguf import GGMLQuantizationType as T
from torch import nn
from transformers import PreTrainedModel

from . import k_quants

SCHEMES = {"q8_0": T.Q8_0, "q4_0": T.Q4_0, "q4_1": T.Q4_1, "q5_0": T.Q5_0, "q4_k_m": T.Q4_K}  # and its base type
_WIDER = T.Q8_0  # the output layer's type under a 4- or 5-bit legacy type
_FALLBACK = {T.Q4_K: T.Q5_0, T.Q6_K: T.Q8_0}  # a K type's where a row is not whole blocks of 256
_OWN = {T.Q4_K: k_quants.q4_k, T.Q6_K: k_quants.q6_k}
_CHUNK_ROWS = 256
_LAYER = re.compile(r"\.layers\.(\d+)\.")


@dataclass(frozen=True)
class Names:
    """The input embedding's and output layer's weight names, and whether they are one tensor."""

    input: str
    output: str
    tied: bool

    @staticmethod
    def of(model: PreTrainedModel) -> "Names":
        found = {id(m): n for n, m in model.named_modules()}
        output = model.get_output_embeddings()
        return Names(f"{found[id(model.get_input_embeddings())]}.weight",
                     f"{found[id(output)]}.weight" if output is not None else "",
                     output is not None and bool(getattr(model.config.get_text_config(), "tie_word_embeddings", False)))


def kinds(model: PreTrainedModel, scheme: str, channels: int) -> dict[str, T]:
    """Each weight that becomes blocks, by name, and its type: the Linear layers whose outputs come
    in whole groups of `channels` (the C kernels'), and the input embedding."""
    names, base = Names.of(model), SCHEMES[scheme]
    layers = model.config.get_text_config().num_hidden_layers
    found: dict[str, T] = {}
    for name, module in model.named_modules():
        if type(module) is nn.Linear and module.out_features % channels == 0:
            weight = f"{name}.weight"
            found[weight] = _fit(_kind(weight, scheme, base, names, layers), module.in_features)
    embedding = model.get_input_embeddings()
    if isinstance(embedding, nn.Embedding):
        found[names.input] = _fit(_output_kind(scheme, base) if names.tied else base, embedding.embedding_dim)
    return found


def _kind(weight: str, scheme: str, base: T, names: Names, layers: int) -> T:
    if weight == names.output:
        return _output_kind(scheme, base)
    layer = _LAYER.search(weight)
    more = scheme == "q4_k_m" and layer is not None and weight.endswith(("v_proj.weight", "down_proj.weight")) \
        and use_more_bits(int(layer.group(1)), layers)
    return T.Q6_K if more else base


def _output_kind(scheme: str, base: T) -> T:
    if scheme == "q4_k_m":
        return T.Q6_K
    return base if _bits(base) >= _bits(_WIDER) else _WIDER


def use_more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's: the layers whose V and down projections Q4_K_M keeps in Q6_K."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def _fit(kind: T, width: int) -> T:
    return _FALLBACK.get(kind, kind) if width % GGML_QUANT_SIZES[kind][0] else kind


def _bits(kind: T) -> float:
    block, size = GGML_QUANT_SIZES[kind]
    return size * 8 / block


def quantize(values: np.ndarray, kind: T, pool: Optional[ThreadPoolExecutor] = None) -> np.ndarray:
    """The blocks [rows, bytes per row] of fp32 values [rows, width] in `kind`, in row chunks on
    the pool's threads where it is given."""
    convert = _OWN.get(kind) or (lambda chunk: quants.quantize(chunk, kind))
    if pool is None or values.shape[0] <= _CHUNK_ROWS:
        return convert(values)
    chunks = np.array_split(values, -(-values.shape[0] // _CHUNK_ROWS))
    return np.concatenate(list(pool.map(convert, chunks)))


def workers() -> ThreadPoolExecutor:
    """The quantizing threads: one per core this process may run on."""
    return ThreadPoolExecutor(max(1, len(os.sched_getaffinity(0))), thread_name_prefix="quantize")
