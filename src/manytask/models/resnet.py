"""`resnet18`: ResNet-18 (He et al., 2016) written here, so the dense tasks get a real multi-scale encoder without
torchvision.

Modules carry torchvision's names (`conv1`, `bn1`, `layer1.0.conv1`, `layer2.0.downsample.0`, ...), so a local
torchvision `resnet18` state dict loads directly (`weights`; its `fc.*` classifier is ignored). Nothing is
downloaded.

- `pyramid(x)`: the outputs of layer1..layer4 (channels width, 2·width, 4·width, 8·width; each stage after the
  first halves the spatial size). `forward(x)`: layer4 average-pooled to `8·width` features.
- `stem: imagenet` is torchvision's (7x7 stride-2 conv, 3x3 stride-2 max-pool: layer1 at 1/4 of the input size);
  `stem: small` (3x3 stride-1 conv, no pool) keeps layer1 at full size, which is what 32x32 images need.
- `norm: none` puts Identity where BatchNorm was, gives the convs a bias (BatchNorm's shift is gone) and zeroes
  each block's last conv, so every residual block starts as the identity and activations do not grow with depth.
- Input channels: conv1 takes the benchmark's channels (gray: 1). A checkpoint fixes conv1's channels instead; a
  3-channel checkpoint on a gray benchmark gets the gray channel repeated to RGB.
- `normalize: imagenet` subtracts the ImageNet mean and divides by its std, which torchvision checkpoints expect
  of inputs in [0, 1].
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor, nn

from manytask.errors import ManytaskError
from manytask.models.backbones import BACKBONES, NORM_DESCRIPTION, Norm
from manytask.models.transformers_backbones import IMAGENET_MEAN, IMAGENET_STD, read_state_dict
from manytask.registry import Params

BLOCKS_PER_STAGE = (2, 2, 2, 2)  # ResNet-18
CHECKPOINT_SUFFIXES = (".safetensors", ".pt", ".pth")


class ResNetParams(Params):
    width: int = Field(default=64, ge=1, description="channels of layer1; layer2..4 have 2, 4 and 8 times as many")
    stem: Literal["imagenet", "small"] = Field(
        default="small", description="imagenet: 7x7/2 conv + 3x3/2 max-pool; small: 3x3/1 conv (32x32 inputs)")
    norm: Norm = Field(default="batch", description=NORM_DESCRIPTION)
    normalize: Literal["none", "imagenet"] = Field(
        default="none", description="imagenet: standardize RGB inputs with ImageNet statistics (for checkpoints)")
    weights: str | None = Field(default=None, description="local torchvision-named resnet18 .safetensors/.pt/.pth")


class SpatialBatchNorm(nn.BatchNorm2d):
    """BatchNorm2d that also takes, in training, a batch holding one value per channel (one sample whose maps are
    1x1: layer4 of a 32x32 image under the imagenet stem, on a client's last mini-batch of one). It has no batch
    variance, so it is normalized with the running statistics."""

    def forward(self, x: Tensor) -> Tensor:
        if self.training and x.shape[0] * x.shape[2] * x.shape[3] == 1:
            return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                                training=False, eps=self.eps)
        return super().forward(x)


def _norm(channels: int, norm: Norm) -> nn.Module:
    return SpatialBatchNorm(channels) if norm == "batch" else nn.Identity()


def _conv(cin: int, cout: int, kernel: int, stride: int, norm: Norm) -> nn.Conv2d:
    """A 'same'-padded conv; biased only without BatchNorm, which would cancel a bias anyway."""
    return nn.Conv2d(cin, cout, kernel, stride=stride, padding=kernel // 2, bias=norm == "none")


class BasicBlock(nn.Module):
    """relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)); the shortcut is a strided 1x1 conv + norm
    (`downsample`) when the block changes the size or the width, the identity otherwise."""

    def __init__(self, cin: int, cout: int, stride: int, norm: Norm) -> None:
        super().__init__()
        self.conv1 = _conv(cin, cout, 3, stride, norm)
        self.bn1 = _norm(cout, norm)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = _conv(cout, cout, 3, 1, norm)
        self.bn2 = _norm(cout, norm)
        self.downsample = (
            nn.Sequential(_conv(cin, cout, 1, stride, norm), _norm(cout, norm)) if stride != 1 or cin != cout
            else None
        )

    def forward(self, x: Tensor) -> Tensor:
        out = self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x)))))
        shortcut = x if self.downsample is None else self.downsample(x)
        return self.relu(out + shortcut)


@BACKBONES.register(
    "resnet18", ResNetParams, "ResNet-18 (torchvision names, local weights), layer1..4 pyramid, pooled layer4"
)
class ResNet18(nn.Module):
    def __init__(self, input_shape: tuple[int, ...], params: ResNetParams) -> None:
        super().__init__()
        image_channels = _image_channels(input_shape)
        path = None if params.weights is None else Path(params.weights).expanduser()
        state = None if path is None else _read_checkpoint(path)
        in_channels = _checkpoint_channels(state, path, image_channels)
        self.in_channels = in_channels
        self.repeat_gray = image_channels == 1 and in_channels == 3
        self.normalize = params.normalize == "imagenet"
        if self.normalize and in_channels != 3:
            raise ManytaskError(f"resnet18 normalize: imagenet needs RGB inputs, but conv1 takes {in_channels}.")
        self._build(in_channels, params)
        self.pyramid_channels = [params.width * 2**i for i in range(len(BLOCKS_PER_STAGE))]
        self.out_features = self.pyramid_channels[-1]
        if state is None:
            self._init_weights(params.norm)
        else:
            _load(self, state, path)

    def _build(self, in_channels: int, params: ResNetParams) -> None:
        imagenet = params.stem == "imagenet"
        self.conv1 = nn.Conv2d(in_channels, params.width, 7 if imagenet else 3, stride=2 if imagenet else 1,
                               padding=3 if imagenet else 1, bias=params.norm == "none")
        self.bn1 = _norm(params.width, params.norm)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1) if imagenet else nn.Identity()
        cin = params.width
        for stage, blocks in enumerate(BLOCKS_PER_STAGE):
            cout = params.width * 2**stage
            layer = [BasicBlock(cin if i == 0 else cout, cout, 2 if stage and i == 0 else 1, params.norm)
                     for i in range(blocks)]
            self.add_module(f"layer{stage + 1}", nn.Sequential(*layer))
            cin = cout

    def _init_weights(self, norm: Norm) -> None:
        """torchvision's init (He normal, fan-out, for convs; BatchNorm as the identity). Without BatchNorm, each
        block's last conv starts at zero so that stacking blocks does not multiply the activations' scale."""
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        if norm == "none":
            for module in self.modules():
                if isinstance(module, BasicBlock):
                    nn.init.zeros_(module.conv2.weight)
                    nn.init.zeros_(module.conv2.bias)

    def _input(self, x: Tensor) -> Tensor:
        """(N, H, W) or (N, C, H, W) floats → what conv1 takes: gray repeated to RGB for a 3-channel checkpoint,
        then ImageNet-standardized if asked."""
        x = x.reshape(len(x), -1, *x.shape[-2:])
        if self.repeat_gray:
            x = x.expand(-1, 3, -1, -1)
        if self.normalize:
            mean = torch.as_tensor(IMAGENET_MEAN, dtype=x.dtype, device=x.device).view(1, 3, 1, 1)
            std = torch.as_tensor(IMAGENET_STD, dtype=x.dtype, device=x.device).view(1, 3, 1, 1)
            x = (x - mean) / std
        return x

    def pyramid(self, x: Tensor) -> list[Tensor]:
        """The outputs of layer1..layer4, finest first."""
        x = self.maxpool(self.relu(self.bn1(self.conv1(self._input(x)))))
        maps = []
        for layer in (self.layer1, self.layer2, self.layer3, self.layer4):
            x = layer(x)
            maps.append(x)
        return maps

    def forward(self, x: Tensor) -> Tensor:
        return self.pyramid(x)[-1].mean(dim=(2, 3))


def _image_channels(input_shape: tuple[int, ...]) -> int:
    """Channels of a (C, H, W) benchmark; (H, W) images are one gray channel."""
    shape = tuple(input_shape)
    if len(shape) == 2:
        return 1
    if len(shape) == 3:
        return shape[0]
    raise ManytaskError(f"the resnet18 backbone needs image inputs of shape (C, H, W) or (H, W), got {shape}.")


def _read_checkpoint(path: Path) -> dict[str, Tensor]:
    """The checkpoint's tensors without torchvision's classifier (`fc.*`)."""
    if not path.is_file():
        raise ManytaskError(f"resnet18 weights not found: {path} is not a file.")
    if path.suffix not in CHECKPOINT_SUFFIXES:
        raise ManytaskError(f"resnet18 weights {path} must be a .safetensors, .pt or .pth state dict file.")
    return {key: value for key, value in read_state_dict(path).items() if not key.startswith("fc.")}


def _checkpoint_channels(state: dict[str, Tensor] | None, path: Path | None, image_channels: int) -> int:
    """conv1's input channels: the benchmark's, or the checkpoint's when it fits them (3 fits gray by repeating)."""
    if state is None or "conv1.weight" not in state:  # a checkpoint without conv1 fails in _load
        return image_channels
    channels = state["conv1.weight"].shape[1]
    if channels != image_channels and (channels, image_channels) != (3, 1):
        raise ManytaskError(
            f"resnet18 weights {path} take {channels}-channel images, but the benchmark's images have "
            f"{image_channels}."
        )
    return channels


def _load(model: nn.Module, state: dict[str, Tensor], path: Path | None) -> None:
    """Load `state` into `model`, requiring every key to be present, known and of the right shape (a BatchNorm's
    `num_batches_tracked` may be absent, as in torchvision's own checkpoints)."""
    expected = model.state_dict()
    missing = [k for k in expected if k not in state and not k.endswith("num_batches_tracked")]
    unknown = [k for k in state if k not in expected]
    reshaped = [k for k in state if k in expected and state[k].shape != expected[k].shape]
    bad = missing + unknown + reshaped
    if bad:
        raise ManytaskError(
            f"resnet18 weights {path} do not fit the model ({len(missing)} keys missing, {len(unknown)} unknown, "
            f"{len(reshaped)} of another shape; first: {bad[0]}); check width, stem and norm."
        )
    model.load_state_dict(state, strict=False)
