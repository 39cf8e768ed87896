"""Small backbones for the offline benchmarks. Each maps an input batch to a feature vector of `out_features`.

`norm: batch` puts a BatchNorm before each ReLU of the hidden layers (mlp) / conv blocks (cnn), whose running
statistics then travel as buffers; `norm: none` (the default) builds exactly the modules it always did, so a seed
gives the same weights as before the option existed."""

from __future__ import annotations

import itertools
import math
from typing import Literal

from pydantic import Field
from torch import Tensor, nn

from manytask.registry import Params, Registry

BACKBONES: Registry[type[nn.Module]] = Registry("backbone")
Norm = Literal["none", "batch"]
NORM_DESCRIPTION = "batch: BatchNorm before each hidden ReLU (its running statistics travel as buffers)"


class FeatureBatchNorm(nn.BatchNorm1d):
    """BatchNorm over feature vectors that also takes a batch of one sample in training, normalizing it with the
    running statistics (a single sample has no batch variance); a client's last mini-batch may hold one sample."""

    def forward(self, x: Tensor) -> Tensor:
        if self.training and len(x) == 1:
            return nn.functional.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                                            training=False, eps=self.eps)
        return super().forward(x)


def _normalized(layer: nn.Module, norm: nn.Module | None) -> list[nn.Module]:
    """layer → (norm) → ReLU."""
    return [layer, *([] if norm is None else [norm]), nn.ReLU()]


class MLPParams(Params):
    hidden: list[int] = Field(default=[128, 64], min_length=1)
    norm: Norm = Field(default="none", description=NORM_DESCRIPTION)


@BACKBONES.register("mlp", MLPParams, "fully connected ReLU network over the flattened input")
class MLP(nn.Module):
    def __init__(self, input_shape: tuple[int, ...], params: MLPParams) -> None:
        super().__init__()
        widths = [math.prod(input_shape), *params.hidden]
        layers: list[nn.Module] = [nn.Flatten()]
        for width_in, width_out in itertools.pairwise(widths):
            norm = FeatureBatchNorm(width_out) if params.norm == "batch" else None
            layers += _normalized(nn.Linear(width_in, width_out), norm)
        self.layers = nn.Sequential(*layers)
        self.out_features = widths[-1]

    def forward(self, x: Tensor) -> Tensor:
        return self.layers(x)


class CNNParams(Params):
    channels: list[int] = Field(default=[16, 32], min_length=1)
    hidden: int = Field(default=64, ge=1)
    norm: Norm = Field(default="none", description=NORM_DESCRIPTION)
    signed_features: bool = Field(default=False, description="the features are the hidden layer's output before its "
                                  "ReLU, which then opens every head (SFMTL-Graph's CNN: anchors of signed features)")


@BACKBONES.register(
    "cnn", CNNParams, "3x3 conv + ReLU + 2x2 max-pool blocks, then one hidden linear layer; an encoder for dense tasks"
)
class SmallCNN(nn.Module):
    """Conv blocks that halve the spatial size while it stays >= 2, then a linear layer to `hidden` features.

    Accepts (C, H, W) inputs, or (H, W) / (L,) which are treated as one channel. As an encoder for dense tasks its
    pyramid is each block's activation before pooling (the first at the input's resolution)."""

    def __init__(self, input_shape: tuple[int, ...], params: CNNParams) -> None:
        super().__init__()
        shape = _as_image_shape(input_shape)
        self.image_shape = shape
        channels, size = shape[0], list(shape[1:])
        blocks: list[nn.Module] = []
        conv = nn.Conv2d if len(size) == 2 else nn.Conv1d
        pool = nn.MaxPool2d if len(size) == 2 else nn.MaxPool1d
        batch_norm = nn.BatchNorm2d if len(size) == 2 else nn.BatchNorm1d
        for width in params.channels:
            norm = batch_norm(width) if params.norm == "batch" else None
            blocks += _normalized(conv(channels, width, kernel_size=3, padding=1), norm)
            if min(size) >= 2:
                blocks.append(pool(2))
                size = [s // 2 for s in size]
            channels = width
        self.features = nn.Sequential(*blocks, nn.Flatten())
        hidden = nn.Linear(channels * math.prod(size), params.hidden)
        self.project: nn.Module | None = nn.Sequential(hidden) if params.signed_features else nn.Sequential(
            hidden, nn.ReLU())
        self.head_input = nn.ReLU() if params.signed_features else None  # what every head applies first
        self.out_features = params.hidden
        self.pyramid_channels = list(params.channels)

    def forward(self, x: Tensor) -> Tensor:
        if self.project is None:
            return self.pyramid(x)[-1].mean(dim=(2, 3))
        return self.project(self.features(x.reshape(len(x), *self.image_shape)))

    def pyramid(self, x: Tensor) -> list[Tensor]:
        """Each block's output after its ReLU, before its pooling: finest first."""
        h = x.reshape(len(x), *self.image_shape)
        levels = []
        for layer in self.features:
            h = layer(h)
            if isinstance(layer, nn.ReLU):
                levels.append(h)
                if len(levels) == len(self.pyramid_channels):
                    break
        return levels

    def drop_vector_features(self) -> None:
        """Serve only dense decoders: the hidden linear layer (most of this backbone's weights) is removed and the
        vector feature becomes the average-pooled last block (`out_features` = its channels)."""
        self.project = None
        self.out_features = self.pyramid_channels[-1]


def _as_image_shape(input_shape: tuple[int, ...]) -> tuple[int, ...]:
    if len(input_shape) == 3:
        return input_shape
    if len(input_shape) in (1, 2):
        return (1, *input_shape)
    raise ValueError(f"the cnn backbone takes inputs of 1 to 3 dimensions, got shape {input_shape}")
