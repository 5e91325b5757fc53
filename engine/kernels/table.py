"""Which kernel runs an operation: one table, by operation, weight type, device and the CPU's
features (llama.cpp's ggml: one op switch, one type table). Every caller asks here, once, when
it is set up (a layer, a model, the step's attention), and a fallback is logged once with its
reason; what runs where is in `/info`-style form from `report()`.

A C kernel gives the guarantees its PyTorch counterpart gives (a row comes out as it does alone),
only faster; where the tensors a call gets do not fit a kernel (a dtype, a shape), its wrapper
returns None and the caller runs PyTorch's op for that call.
"""
import enum
import functools
import logging
from dataclasses import dataclass

from . import build

log = logging.getLogger(__name__)


class Op(enum.StrEnum):
    PAGED_ATTENTION = "paged_attention"  # a step's attention over the paged pool
    PAGED_ATTENTION_FP16 = "paged_attention_fp16"  # the same over a pool of fp16 keys and values
    INT4_MATMUL = "int4_matmul"  # an int4 layer's product
    INT8_MATMUL = "int8_matmul"  # the int8 output layer's product
    FP32_MATMUL = "fp32_matmul"  # an fp32 Linear's product (any model served in fp32 on CPU)
    DECODER_LAYERS = "decoder_layers"  # whole Llama decoder layers (and their norms and SiLU)
    GREEDY = "greedy"  # the plain greedy rows' argmax and log probability


# what each C kernel needs beyond being built: its `*_ready` answer, what that answer means, and
# the weights it takes (None: any)
_READY = {Op.INT4_MATMUL: "int4_matmul_ready", Op.INT8_MATMUL: "int8_matmul_ready",
          Op.FP32_MATMUL: "dense_matmul_ready", Op.GREEDY: "greedy_ready",
          Op.PAGED_ATTENTION_FP16: "paged_attention_f16_ready"}
_QUANT = {1: "plain C, int16 activations", 2: "AVX2, int16 activations", 3: "AVX-512, int16 activations"}
_READY_MEANS = {Op.INT4_MATMUL: _QUANT, Op.INT8_MATMUL: _QUANT, Op.FP32_MATMUL: {1: "AVX2 + FMA"},
                Op.GREEDY: {1: "built for this CPU"}, Op.PAGED_ATTENTION_FP16: {1: "built for this CPU"}}
_NEEDS = {Op.FP32_MATMUL: "AVX2 + FMA"}
_WEIGHTS = {Op.INT4_MATMUL: ("int4",), Op.INT8_MATMUL: ("int8",), Op.FP32_MATMUL: ("fp32",),
            Op.DECODER_LAYERS: ("int4",)}
_SOURCES = {Op.PAGED_ATTENTION: "paged_attention.c", Op.PAGED_ATTENTION_FP16: "paged_attention_f16.c",
            Op.INT4_MATMUL: "quant_matmul.c", Op.INT8_MATMUL: "quant_matmul.c",
            Op.FP32_MATMUL: "dense_matmul.c",
            Op.DECODER_LAYERS: "llama_layer.c", Op.GREEDY: "greedy.c"}


@dataclass(frozen=True)
class Kernel:
    op: Op
    c: bool  # the C kernel runs (else PyTorch's op)
    why: str  # what runs and why: the CPU feature it uses, or the reason it falls back

    def __str__(self) -> str:
        return f"{self.op}: {_SOURCES[self.op] if self.c else 'PyTorch'} ({self.why})"


_logged: set[Kernel] = set()


def choose(op: Op, weights: str = "fp32", device: str = "cpu") -> Kernel:
    """The kernel for `op` on `weights` (int4, int8, fp32, ...) on `device`; a fallback is logged
    once, with its reason."""
    kernel = _decide(op, weights, device)
    if not kernel.c and kernel not in _logged:
        _logged.add(kernel)
        log.info("kernel %s", kernel)
    return kernel


def _decide(op: Op, weights: str, device: str) -> Kernel:
    if device != "cpu":
        return Kernel(op, False, f"the C kernels run on CPU, not {device}")
    if weights not in _WEIGHTS.get(op, (weights,)):
        return Kernel(op, False, f"{weights} weights: it takes {', '.join(_WEIGHTS[op])}")
    library = build.library()
    if library is None:
        return Kernel(op, False, f"not built: {build.why_unbuilt()}")
    if op not in _READY:
        return Kernel(op, True, "built for this CPU")
    ready = _ready(library, _READY[op])
    if not ready:
        return Kernel(op, False, f"this CPU lacks {_NEEDS.get(op, 'what it needs')}")
    return Kernel(op, True, _READY_MEANS[op][ready])


@functools.cache
def _ready(library: object, probe: str) -> int:
    return int(getattr(library, probe)())


def report(weights: str = "int4", device: str = "cpu") -> list[str]:
    """Every operation's kernel, as the logs and the docs say it."""
    return [str(choose(op, "int8" if op is Op.INT8_MATMUL else weights, device)) for op in Op]
