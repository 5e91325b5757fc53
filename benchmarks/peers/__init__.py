"""Peer servers the benchmark compares against, each reproducing a documented recipe."""
import torch


def pick_device_dtype() -> tuple[str, torch.dtype]:
    """The same choice as the engine's loader: cuda + bf16 when there is a GPU, else cpu + fp32."""
    if torch.cuda.is_available():
        return "cuda", torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return "cpu", torch.float32
