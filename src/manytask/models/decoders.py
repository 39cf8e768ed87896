"""Per-task dense decoders: multi-scale encoder features → one map at the input's resolution.

`FCNDecoder` is the FCN-style head FedDEA describes (its Sec. 5 implementation details), scaled down: each
pyramid level is projected to `width` channels by a 1×1 convolution, upsampled to the finest level and summed;
a 3×3 convolution (+ BatchNorm with `norm: batch`) + ReLU fuses them, a 1×1 convolution predicts the task's
channels, and a bilinear upsample brings the map to the input's size (the paper's two transposed convolutions
become one resize, which has no weights to learn at these sizes).

An encoder that feeds it has `pyramid_channels` (finest first) and `pyramid(x) -> [maps]`.
"""

from __future__ import annotations

from typing import Literal, Protocol

import torch.nn.functional as F
from pydantic import Field
from torch import Tensor, nn

from manytask.registry import Params


class DecoderParams(Params):
    width: int = Field(32, ge=1, description="channels of the fused feature map")
    norm: Literal["none", "batch"] = Field("none", description="batch: BatchNorm after the fusing convolution")


class PyramidEncoder(Protocol):
    pyramid_channels: list[int]

    def pyramid(self, x: Tensor) -> list[Tensor]: ...


def supports_dense(backbone: nn.Module) -> bool:
    return hasattr(backbone, "pyramid") and hasattr(backbone, "pyramid_channels")


class Pyramid(nn.Module):
    """An encoder's `pyramid` as a module's forward, for `functional_call` (its parameters: `PREFIX` + the
    encoder's names)."""

    PREFIX = "backbone."

    def __init__(self, backbone: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone

    def forward(self, x: Tensor) -> list[Tensor]:
        return self.backbone.pyramid(x)


class FCNDecoder(nn.Module):
    def __init__(self, in_channels: list[int], out_channels: int, params: DecoderParams) -> None:
        super().__init__()
        self.lateral = nn.ModuleList(nn.Conv2d(channels, params.width, kernel_size=1) for channels in in_channels)
        norm = [nn.BatchNorm2d(params.width)] if params.norm == "batch" else []
        self.fuse = nn.Sequential(nn.Conv2d(params.width, params.width, kernel_size=3, padding=1), *norm, nn.ReLU())
        self.predict = nn.Conv2d(params.width, out_channels, kernel_size=1)

    def forward(self, maps: list[Tensor], size: tuple[int, int]) -> Tensor:
        finest = tuple(maps[0].shape[-2:])
        fused = sum(_resized(project(level), finest) for project, level in zip(self.lateral, maps, strict=True))
        return _resized(self.predict(self.fuse(fused)), size)


def _resized(x: Tensor, size: tuple[int, ...]) -> Tensor:
    if tuple(x.shape[-2:]) == tuple(size):
        return x
    return F.interpolate(x, size=size, mode="bilinear", align_corners=False)
