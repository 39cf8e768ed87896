"""The plain-chain backbones (`mlp`, `cnn`) run for a stack of rows without `vmap`, layer by layer.

`vmap` of a convolution with per-row weights becomes a grouped convolution, and every layer after it moves the row
dimension back and forth (a copy per layer; a max-pool over a strided tensor was a third of a CNN round on a CPU).
Here a convolutional activation keeps one layout throughout, (batch, rows × channels, *spatial): a convolution is
one grouped convolution (groups = rows), ReLU and pooling act on it as on any batch, and BatchNorm's per-(row,
channel) statistics are per-channel statistics of this layout. After `Flatten`, activations are (rows, batch,
features) and a linear layer is one batched matrix product. The arithmetic is the layers' own, so the result
equals the `vmap` path's up to float rounding (tests/test_batched.py runs both)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from manytask.execution.norms import Statistics, masked_batch_norm
from manytask.models.backbones import MLP, FeatureBatchNorm, SmallCNN

Chain = Callable[[Mapping[str, Tensor], Mapping[str, Tensor], Tensor, Tensor], tuple[Tensor, dict[str, Statistics]]]
CONVOLUTIONS = {nn.Conv1d: F.conv1d, nn.Conv2d: F.conv2d}
POOLS = {nn.MaxPool1d: F.max_pool1d, nn.MaxPool2d: F.max_pool2d}


class _Activation:
    """The running activation of a stack of `rows`: grouped, (batch, rows × channels, *spatial), or by rows,
    (rows, batch, ...)."""

    def __init__(self, x: Tensor) -> None:
        self.rows, self.batch = x.shape[:2]
        self.value, self.grouped = x, False

    def as_grouped(self) -> Tensor:
        if not self.grouped:
            x = self.value
            self.value = x.transpose(0, 1).reshape(self.batch, self.rows * x.shape[2], *x.shape[3:])
            self.grouped = True
        return self.value

    def as_rows(self) -> Tensor:
        if self.grouped:
            x = self.value
            self.value = x.view(self.batch, self.rows, -1, *x.shape[2:]).transpose(0, 1)
            self.grouped = False
        return self.value


def chain_layers(backbone: nn.Module) -> list[tuple[str, nn.Module]] | None:
    """The backbone's layers in order, by name, where it is a plain chain this module runs; else None."""
    if type(backbone) is MLP:
        return [(f"layers.{n}", m) for n, m in backbone.layers.named_children()]
    if type(backbone) is SmallCNN and backbone.project is not None:
        return [("", nn.Unflatten(1, backbone.image_shape)),
                *[(f"features.{n}", m) for n, m in backbone.features.named_children()],
                *[(f"project.{n}", m) for n, m in backbone.project.named_children()]]
    return None


def _supported(module: nn.Module) -> bool:
    if isinstance(module, tuple(CONVOLUTIONS)):
        return module.groups == 1 and module.padding_mode == "zeros" and isinstance(module.padding, tuple)
    if isinstance(module, nn.modules.batchnorm._BatchNorm):
        return module.momentum is not None and module.track_running_stats and type(module) in (
            nn.BatchNorm1d, nn.BatchNorm2d, FeatureBatchNorm)
    return isinstance(module, (nn.Linear, nn.ReLU, nn.Flatten, nn.Unflatten, *POOLS))


def chain_forward(backbone: nn.Module) -> Chain | None:
    """(per-row parameters, per-row buffers, inputs (rows, batch, ...), sample mask (rows, batch)) -> (features
    (rows, batch, features), each BatchNorm's statistics), for a plain-chain backbone; None for any other."""
    layers = chain_layers(backbone)
    if layers is None or not all(_supported(m) for _, m in layers):
        return None

    def forward(params: Mapping[str, Tensor], buffers: Mapping[str, Tensor], x: Tensor, mask: Tensor
                ) -> tuple[Tensor, dict[str, Statistics]]:
        act = _Activation(x)
        stats: dict[str, Statistics] = {}
        for name, layer in layers:
            _apply(name, layer, act, params, buffers, mask, stats)
        return act.as_rows(), stats

    return forward


def _apply(name: str, layer: nn.Module, act: _Activation, params: Mapping[str, Tensor],
           buffers: Mapping[str, Tensor], mask: Tensor, stats: dict[str, Statistics]) -> None:
    rows = act.rows
    if isinstance(layer, tuple(CONVOLUTIONS)):
        weight, bias = params[f"{name}.weight"], params.get(f"{name}.bias")
        act.value = CONVOLUTIONS[type(layer)](
            act.as_grouped(), weight.reshape(-1, *weight.shape[2:]), None if bias is None else bias.reshape(-1),
            layer.stride, layer.padding, layer.dilation, rows)
    elif isinstance(layer, nn.modules.batchnorm._BatchNorm):
        stats[name] = _batch_norm(name, layer, act, params, buffers, mask)
    elif isinstance(layer, nn.Linear):
        x = act.as_rows()
        weight, bias = params[f"{name}.weight"], params.get(f"{name}.bias")
        act.value = torch.bmm(x, weight.transpose(1, 2)) if bias is None else torch.baddbmm(
            bias.unsqueeze(1), x, weight.transpose(1, 2))
    elif isinstance(layer, nn.ReLU):
        act.value = F.relu(act.value)
    elif isinstance(layer, tuple(POOLS)):
        act.value = POOLS[type(layer)](act.as_grouped(), layer.kernel_size, layer.stride, layer.padding,
                                       layer.dilation, layer.ceil_mode)
    elif isinstance(layer, nn.Flatten):
        act.value = act.as_rows().flatten(2)
    else:  # Unflatten: the input's (batch, features) as the backbone's image shape
        x = act.as_rows()
        act.value = x.reshape(*x.shape[:2], *layer.unflattened_size)


def _batch_norm(name: str, layer: nn.modules.batchnorm._BatchNorm, act: _Activation,
                params: Mapping[str, Tensor], buffers: Mapping[str, Tensor], mask: Tensor) -> Statistics:
    rows = act.rows
    affine = None if layer.weight is None else (params[f"{name}.weight"], params[f"{name}.bias"])
    running = (buffers[f"{name}.running_mean"], buffers[f"{name}.running_var"])
    single = running if isinstance(layer, FeatureBatchNorm) else None
    if act.value.dim() == 3 and not act.grouped:  # features by rows: (rows, batch, features)
        x = act.value
        channel = (rows, 1, -1)
        act.value, (mean, variance, moves) = masked_batch_norm(
            x, mask.unsqueeze(-1), mask.sum(1, keepdim=True), [1], channel, layer.eps, affine, single)
        return mean, variance, moves.view(rows)
    x = act.as_grouped()
    channels = x.shape[1] // rows
    spatial = math.prod(x.shape[2:])
    weights = mask.t().repeat_interleave(channels, dim=1).view(*x.shape[:2], *([1] * (x.dim() - 2)))
    count = (mask.sum(1) * spatial).repeat_interleave(channels)
    flat = None if affine is None else (affine[0].reshape(-1), affine[1].reshape(-1))
    flat_single = None if single is None else (single[0].reshape(-1), single[1].reshape(-1))
    act.value, (mean, variance, moves) = masked_batch_norm(
        x, weights, count, [0, *range(2, x.dim())], (1, -1, *([1] * (x.dim() - 2))), layer.eps, flat, flat_single)
    return mean.view(rows, channels), variance.view(rows, channels), moves.view(rows, channels)[:, 0]
