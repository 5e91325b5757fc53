"""Weight-only int4 for CPU (`dtype: int4`, and `auto` for weights that already are 4-bit).

Each row of a layer's weight is cut into groups of 32 along its input. Each group is stored as
4-bit steps between its own minimum and maximum. That is llama.cpp's Q4_1, so the default model,
shipped as a Q4_1 GGUF, keeps the weights it was published with. A Q4_0 GGUF's blocks, d·(q - 8),
are the same form (low -8·d), so its weights are kept as published too.

A decode step of SmolLM2-135M then reads about 66 MB of int4 weights (106 M weights at 0.625
bytes: half a byte, and fp16 scale and low per 32) and 28 MB of int8 output layer, instead of
540 MB. The output layer (Q8_0 in that GGUF) stays Q8_0: int8 steps with an fp16 scale per 32.

The products run in quant_matmul.c (native.py) wherever the kernels are built: exact integer
products of the weights' steps and the activations rounded to int16 per block of 32
(`int16_blocks`), fp16 scales (the GGUF's own), fp32 sums and output in one fixed order, so every
CPU computes the same bits (kernels/arith.h). The output layer runs there too, on the same
int16 activations. Where the kernels cannot be built, the products run in PyTorch's
`_weight_int4pack_mm_for_cpu` and `_weight_int8pack_mm`, which round the activations, scales
and output to bf16. All of them compute each row of a batch the same way whatever the batch
holds (tests/test_int4.py checks batches of 2 to 64 rows bit for bit), so a request still comes
out as it does alone.
"""
from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional, TypeVar

import torch
from torch import nn

from ..kernels import native
from ..kernels.table import Op, choose
from .placement import put

GROUP = 32  # Q4_1's block


class Int4Linear(nn.Module):
    """A Linear whose weight is int4 in groups of GROUP; the bias and output keep x's dtype."""

    packed: torch.Tensor
    scale: torch.Tensor
    low: torch.Tensor
    scales_zeros: torch.Tensor

    def __init__(self, linear: nn.Linear, steps: torch.Tensor, scale: torch.Tensor, low: torch.Tensor,
                 wide: bool = False):
        """wide: scale and low are fp32 values that fp16 cannot hold (a Q4_K's, gguf_types.py); only
        the C kernel takes them."""
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.c_kernel = self.out_features % native.INT4_CHANNELS == 0 and choose(Op.INT4_MATMUL, "int4").c
        self.wide = wide
        if wide and not self.c_kernel:
            raise ValueError("int4 weights with fp32 scales run in quant_matmul.c only")
        if self.c_kernel:
            self._pack_native(steps, scale, low)
        else:
            self.register_buffer("packed", torch.ops.aten._convert_weight_to_int4pack_for_cpu(steps.to(torch.int32), 1))
            zero = low + 8 * scale  # PyTorch's convention: weight = (step - 8) * scale + zero
            pairs = torch.stack([scale.t(), zero.t()], dim=-1)  # [groups, out, 2]
            self.register_buffer("scales_zeros", pairs.contiguous().to(torch.bfloat16))
        self.bias = linear.bias

    def _pack_native(self, steps: torch.Tensor, scale: torch.Tensor, low: torch.Tensor) -> None:
        """quant_matmul.c's layout: [out/16][in/32][16 input pairs][16 outputs] bytes, each holding
        a pair's two steps (low nibble first); scale and low [out/16][in/32][16], fp16 (they
        already are fp16 values: `_quantize`'s)."""
        groups, blocks = self.out_features // native.INT4_CHANNELS, self.in_features // GROUP
        by_group = steps.view(groups, native.INT4_CHANNELS, blocks, GROUP // 2, 2).permute(0, 2, 3, 1, 4)
        self.register_buffer("packed", (by_group[..., 0] | (by_group[..., 1] << 4)).to(torch.uint8).contiguous())
        for name, values in (("scale", scale), ("low", low)):
            values = values.float() if self.wide else values.half()
            self.register_buffer(name, values.view(groups, native.INT4_CHANNELS, blocks).permute(0, 2, 1).contiguous())
        self.weights = native.int4_weights(self.packed, self.scale, self.low)

    @classmethod
    def of_packed(cls, linear: nn.Linear, packed: torch.Tensor, scale: torch.Tensor, low: torch.Tensor) -> "Int4Linear":
        """The layer of buffers already in quant_matmul.c's layout with fp16 or fp32 scales and lows,
        as `_pack_native` makes them, or with a Q4_K's own scales (`native.int4k_matmul`'s: scale
        fp16 d and -dmin per 256, low u8 sc and m per 32): gguf_repack.c's of a Q4_0, Q4_1 or Q4_K
        tensor. Only where the C kernel runs (its callers check `gguf_native.servable`)."""
        layer = _bare(cls, linear)
        layer.wide = not (scale.dtype == low.dtype == torch.float16)
        layer.adopt(packed, scale, low)
        return layer

    @property
    def own_scales(self) -> bool:
        """Whether the buffers hold a Q4_K's scales as its file does (of_packed: u8 sc and m)."""
        low = getattr(self, "low", None)
        return low is not None and low.dtype == torch.uint8

    def adopt(self, packed: torch.Tensor, scale: torch.Tensor, low: torch.Tensor) -> None:
        """Hold these buffers instead (the same values: views into buffers that several layers'
        weights share end to end, c_stack.py's joined q, k, v)."""
        for name, values in (("packed", packed), ("scale", scale), ("low", low)):
            self.register_buffer(name, values)
        self.repoint()

    def repoint(self) -> None:
        """The C kernel's pointers to the buffers, again: after they moved (adopt, `.to()`, or
        shared_weights.py mapping them from a file)."""
        if self.c_kernel:
            self.weights = native.int4_weights(self.packed, self.scale, self.low)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        if self.own_scales:
            y = native.int4k_matmul(rows, self.packed, self.scale, self.low)
        elif self.wide:
            y = native.int4f_matmul(rows, self.packed, self.scale, self.low)
        elif self.c_kernel:
            y = native.int4_matmul(rows, self.weights)
        else:
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(rows.to(torch.bfloat16), self.packed, GROUP,
                                                           self.scales_zeros)
        return _finish(y, x, self.out_features, self.bias)

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> "Int4Linear":
        """`.to()` and the like may move the buffers that `weights` points at: point again."""
        module = super()._apply(fn, recurse)
        if self.c_kernel:
            scale_dtype = torch.float32 if self.wide and not self.own_scales else torch.float16
            if self.packed.device.type != "cpu" or self.scale.dtype != scale_dtype:
                scales = "the file's own" if self.own_scales else "fp32" if self.wide else "fp16"
                raise ValueError(f"dtype: int4 layers run on CPU with {scales} scales; load the model again instead")
            self.repoint()
        return module


class Int8Linear(nn.Module):
    """A Linear whose weight is int8. With the C kernel, llama.cpp's Q8_0: steps in blocks of GROUP
    inputs, each block's scale (its largest magnitude / 127) in fp16, so a Q8_0 GGUF's output layer
    keeps its own steps and scales, bit for bit. PyTorch's kernel (no compiler) takes one scale
    per output instead."""

    weight_int8: torch.Tensor
    scales: torch.Tensor
    lows: Optional[torch.Tensor]

    def __init__(self, linear: nn.Linear, exact: Optional[tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]] = None):
        """exact: a GGUF tensor's (steps [out, in] int8, scales, lows or None) as gguf_types.py splits
        it: fp16 scales per 32 (Q8_0, Q5_0), or fp32 scales and lows per 16 (the C kernel only)."""
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.c_kernel = self.out_features % native.DENSE_CHANNELS == 0 and choose(Op.INT8_MATMUL, "int8").c
        self.register_buffer("lows", None)
        self.sub = False  # fp32 scales (and lows) per 16 inputs
        if exact is not None and not self.c_kernel:
            raise ValueError("int8 weights kept as a GGUF holds them run in quant_matmul.c only")
        if self.c_kernel:  # quant_matmul.c's layout: [out/16][in][16], scales [out/16][blocks][16]
            steps, scale, low = exact if exact is not None else (*q8_0(linear.weight.detach().float()), None)
            self.sub = scale.dtype == torch.float32
            steps = steps.view(-1, native.DENSE_CHANNELS, self.in_features).transpose(1, 2)
            scale = scale.view(-1, native.DENSE_CHANNELS, scale.shape[1]).transpose(1, 2)
            if low is not None:
                self.lows = low.view(-1, native.DENSE_CHANNELS, low.shape[1]).transpose(1, 2).contiguous()
        else:
            weight = linear.weight.detach().float()
            scale = (weight.abs().amax(dim=1) / 127).clamp(min=1e-12)
            steps = (weight / scale[:, None]).round().clamp(-127, 127).to(torch.int8)
            scale = scale.to(torch.bfloat16)
        self.register_buffer("weight_int8", steps.contiguous())
        self.register_buffer("scales", scale.contiguous())
        self.bias = linear.bias

    @classmethod
    def of_packed(cls, linear: nn.Linear, steps: torch.Tensor, scales: torch.Tensor,
                  own: Optional[torch.Tensor] = None) -> "Int8Linear":
        """The layer of buffers already in quant_matmul.c's layout, steps [out / 16, in, 16] with fp32
        scales per 16 inputs and no lows, with a Q6_K's own scales (`native.int8k_matmul`'s:
        `scales` fp16 d per 256, `own` its int8 sc per 16, held as `lows`), or with Q8_0's fp16
        scales per 32 (no `own`): gguf_repack.c's of a Q6_K, Q5_0 or Q8_0 tensor."""
        layer = _bare(cls, linear)
        layer.sub = own is not None or scales.dtype == torch.float32
        layer.adopt(steps, scales, own)
        return layer

    @property
    def own_scales(self) -> bool:
        """Whether the buffers hold a Q6_K's scales as its file does (of_packed)."""
        return self.lows is not None and self.lows.dtype == torch.int8

    @property
    def weights(self) -> native.Weights:
        """The C kernel's view of the buffers (where `c_kernel`), for the whole C layers."""
        return native.int8_weights(self.weight_int8, self.scales, self.lows)

    def adopt(self, steps: torch.Tensor, scales: torch.Tensor, lows: Optional[torch.Tensor]) -> None:
        """Hold these buffers instead (the same values: views into buffers shared end to end)."""
        for name, values in (("weight_int8", steps), ("scales", scales), ("lows", lows)):
            self.register_buffer(name, values)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        if self.own_scales:
            assert self.lows is not None
            y = native.int8k_matmul(rows, self.weight_int8, self.scales, self.lows)
        elif self.sub:
            y = native.int8s_matmul(rows, self.weight_int8, self.scales, self.lows)
        elif self.c_kernel:
            y = native.int8_matmul(rows, self.weight_int8, self.scales)
        else:
            y = torch.ops.aten._weight_int8pack_mm(rows.to(torch.bfloat16), self.weight_int8, self.scales)
        return _finish(y, x, self.out_features, self.bias)


Layer = TypeVar("Layer", "Int4Linear", "Int8Linear")


def _bare(cls: type[Layer], linear: nn.Linear) -> Layer:
    """A C product layer in place of `linear` (its shape and bias), before its buffers: for buffers
    made elsewhere in the kernel's layout (`of_packed`)."""
    layer = cls.__new__(cls)
    nn.Module.__init__(layer)
    layer.in_features, layer.out_features = linear.in_features, linear.out_features
    layer.c_kernel, layer.bias = True, linear.bias
    return layer


def q8_0(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """llama.cpp's Q8_0 of weight [out, in]: steps [out, in] int8 and scales [out, blocks] fp16,
    each block of GROUP inputs (the last padded with zeros) d = its largest magnitude / 127 rounded
    to fp16, steps round(w / d). Weights that are a Q8_0's (d q with fp16 d) come back to the same
    steps and scales exactly."""
    out, width = weight.shape
    blocks = torch.nn.functional.pad(weight.float(), (0, -width % GROUP)).view(out, -1, GROUP)
    scale = (blocks.abs().amax(dim=-1) / 127).half()
    inverse = torch.where(scale > 0, 1 / scale.float(), torch.zeros_like(scale, dtype=torch.float32))
    steps = (blocks * inverse[..., None]).round().clamp(-127, 127).to(torch.int8)
    return steps.view(out, -1)[:, :width].contiguous(), scale


def _finish(y: torch.Tensor, x: torch.Tensor, width: int, bias: Optional[torch.Tensor]) -> torch.Tensor:
    y = y.to(x.dtype).reshape(*x.shape[:-1], width)
    return y if bias is None else y + bias


def int16_blocks(x: torch.Tensor) -> torch.Tensor:
    """x [rows, width] fp32 as quant_matmul.c multiplies it, in float64: per block of GROUP (the
    last one padded with zeros), steps round(x * (32767 / top)) (to nearest even) times the scale
    top / 32767, where top is the block's largest magnitude."""
    rows, width = x.shape
    padded = torch.nn.functional.pad(x.float(), (0, -width % GROUP))
    blocks = padded.reshape(rows, -1, GROUP)
    top = blocks.abs().amax(dim=-1, keepdim=True)
    inverse = torch.where(top > 0, 32767 / top, torch.zeros_like(top))  # fp32, as the kernel divides
    steps = torch.round(blocks * inverse)
    return (steps.double() * (top / 32767).double()).reshape(rows, -1)[:, :width]


def dequantize(steps: torch.Tensor, scale: torch.Tensor, low: torch.Tensor,
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The weight [out, in] that `_quantize`'s steps stand for: step * scale + low per group."""
    out = steps.shape[0]
    groups = steps.view(out, -1, GROUP).to(dtype)
    return (groups * scale[..., None].to(dtype) + low[..., None].to(dtype)).view(out, -1)


def _quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool]:
    """(steps 0..15 [out, in] int32, scale and low [out, groups] (fp16 values, as a GGUF holds
    them), whether that is exact).

    A group spans its own range in 15 steps (Q4_1's blocks do). A group that does not fit that
    exactly may be a Q4_0 block, d·(q - 8) with d its largest-magnitude weight over -8: steps of d
    (negative when that weight is positive) from low = -8·d, and it is taken so when exact."""
    out, width = weight.shape
    groups = weight.view(out, width // GROUP, GROUP)
    low = _fp16(groups.amin(dim=-1))
    scale = _fp16((groups.amax(dim=-1) - low) / 15).clamp(min=2.0 ** -24)  # fp16's smallest step
    exact = _exact(groups, scale, low)
    if not exact.all():
        extreme = _fp16(groups.gather(-1, groups.abs().argmax(dim=-1, keepdim=True)).squeeze(-1))
        d = torch.where(extreme == 0, 2.0 ** -24, _fp16(extreme / -8))
        use = ~exact & _exact(groups, d, extreme)
        scale, low = torch.where(use, d, scale), torch.where(use, extreme, low)
        exact = exact | use
    steps = ((groups - low[..., None]) / scale[..., None]).round().clamp(0, 15)
    return steps.to(torch.int32).view(out, width), scale, low, bool(exact.all())


def _exact(groups: torch.Tensor, scale: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
    """Per group: whether steps 0..15 of `scale` from `low` give back its weights (to within
    float32's rounding of step·scale + low)."""
    steps = ((groups - low[..., None]) / scale[..., None]).round().clamp(0, 15)
    return (steps * scale[..., None] + low[..., None] - groups).abs().amax(dim=-1) / scale.abs() < 1e-5


def _fp16(values: torch.Tensor) -> torch.Tensor:
    """The nearest values that fp16 holds (within its range), as fp32."""
    return values.clamp(-65504, 65504).half().float()


@dataclass
class Swap:
    """One Linear's quantized form, as `swap_in` puts it in place: int4 steps [out, in] 0..15 with
    fp16 scale and low per GROUP, or (no low) the output layer's Q8_0 steps [out, in] int8 and fp16
    scales per GROUP."""

    name: str
    steps: torch.Tensor
    scale: torch.Tensor
    low: Optional[torch.Tensor]


def swaps(model: nn.Module, only_if_exact: bool = False) -> Optional[list[Swap]]:
    """int4 for every Linear of the layers, Q8_0 for the output layer; None where it cannot be done
    (a width not a multiple of GROUP, no layer) or, with only_if_exact, where a layer's weights are
    not 4-bit in groups of GROUP already."""
    get_output = getattr(model, "get_output_embeddings", None)
    output = get_output() if callable(get_output) else None  # a transformers model's lm_head
    found: list[Swap] = []
    outputs: list[Swap] = []
    for name, child in list(model.named_modules()):
        if type(child) is not nn.Linear:  # a Linear, not a subclass of it
            continue
        weight = child.weight.detach().float()
        if child is output:
            outputs.append(Swap(name, *q8_0(weight), None))
            continue
        if child.in_features % GROUP:
            return None
        steps, scale, low, exact = _quantize(weight)
        if only_if_exact and not exact:
            return None
        found.append(Swap(name, steps, scale, low))
    return found + outputs if found else None


def swap_in(model: nn.Module, found: list[Swap]) -> None:
    """Each Linear named replaced by its int4 layer (Int8Linear for the output layer's, of its Q8_0
    steps where the C kernel takes them, else of the weight itself)."""
    c_int8 = choose(Op.INT8_MATMUL, "int8").c
    for swap in found:
        child = model.get_submodule(swap.name)
        assert isinstance(child, nn.Linear), swap.name
        if swap.low is not None:
            layer: nn.Module = Int4Linear(child, swap.steps, swap.scale, swap.low)
        else:
            c_layer = c_int8 and child.out_features % native.DENSE_CHANNELS == 0
            layer = Int8Linear(child, (swap.steps, swap.scale, None) if c_layer else None)
        put(model, swap.name, layer)


def quantize(model: nn.Module, only_if_exact: bool = False) -> bool:
    """int4 for every Linear of the layers, int8 for the output layer; returns whether it did.
    only_if_exact: only when every layer's weights already are 4-bit in groups of GROUP."""
    found = swaps(model, only_if_exact)
    if found is None:
        return False
    swap_in(model, found)
    return True
