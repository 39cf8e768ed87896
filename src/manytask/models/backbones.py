"""Small backbones for the offline benchmarks. Each maps an input batch to a feature vector of `out_features`.

`norm: batch` puts a BatchNorm before each ReLU of the hidden layers (mlp) / conv blocks (cnn), whose running
statistics then travel as buffers; `norm: none` (the default) builds exactly the modules it always did, so a seed
gives the same weights as before the option existed."""

from __future__ import annotations

import itertools
import math
from typing import Literal

import torch
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


class CharLSTMParams(Params):
    vocab: int = Field(default=80, ge=1, description="token ids 0..vocab-1 (LEAF's Shakespeare: 80 characters)")
    embedding: int = Field(default=8, ge=1, description="embedding width (LEAF: 8)")
    hidden: int = Field(default=64, ge=1, description="LSTM width, the feature size (LEAF: 256)")
    layers: int = Field(default=2, ge=1, description="stacked LSTM layers (LEAF: 2)")


class LSTMLayer(nn.Module):
    """One LSTM layer written with linear layers and a loop over the steps (nn.LSTM's equations, gates i, f, g, o):
    `torch.func.vmap` has no batching rule for nn.LSTM's fused kernel, and the batched executor vmaps a round's
    clients."""

    def __init__(self, width_in: int, hidden: int) -> None:
        super().__init__()
        self.input = nn.Linear(width_in, 4 * hidden)
        self.recurrent = nn.Linear(hidden, 4 * hidden, bias=False)
        self.hidden = hidden

    def forward(self, x: Tensor) -> Tensor:
        """(N, L, width_in) -> every step's output, (N, L, hidden)."""
        steps = self.input(x).unbind(1)  # the input's share of every gate, all steps at once
        h = torch.zeros_like(steps[0][..., : self.hidden])
        c, outputs = h, []
        for step in steps:
            i, f, g, o = (step + self.recurrent(h)).chunk(4, dim=-1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            outputs.append(h)
        return torch.stack(outputs, dim=1)


@BACKBONES.register("char-lstm", CharLSTMParams, "embedding + stacked LSTM over token-id sequences (LEAF Shakespeare)")
class CharLSTM(nn.Module):
    """LEAF's next-character model without its output layer: token ids (N, L) are embedded and run through a stacked
    LSTM; the features are the last step's output, which a task's head maps to the next token."""

    def __init__(self, input_shape: tuple[int, ...], params: CharLSTMParams) -> None:
        super().__init__()
        if len(input_shape) != 1:
            raise ValueError(f"the char-lstm backbone takes sequences of token ids, shape (L,), got {input_shape}")
        self.embed = nn.Embedding(params.vocab, params.embedding)
        widths = [params.embedding, *[params.hidden] * params.layers]
        self.layers = nn.Sequential(*(LSTMLayer(a, b) for a, b in itertools.pairwise(widths)))
        self.out_features = params.hidden

    def forward(self, x: Tensor) -> Tensor:
        return self.layers(self.embed(x.long()))[:, -1]
