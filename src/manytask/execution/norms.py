"""Batch normalization for a batched round: each row of the batch (one client's mini-batch, padded to the batch
size) is normalized with the statistics of its own real samples, and its running statistics are its own.

`masked_copy` gives a copy of a module in which every BatchNorm reads the current row's sample mask from a
`NormContext` and reports its batch statistics there, instead of updating buffers in place (which `vmap` cannot
do per row); the executor then moves each client's running statistics as its BatchNorm layers would have."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from manytask.execution.plan import Unbatchable
from manytask.models.backbones import FeatureBatchNorm
from manytask.models.resnet import SpatialBatchNorm

Statistics = tuple[Tensor, Tensor, Tensor]  # (batch mean, unbiased batch variance, elements per channel)


@dataclass
class NormContext:
    mask: Tensor | None = None  # (batch,) 1 on a row's real samples, 0 on padding
    stats: dict[str, Statistics] = field(default_factory=dict)  # per BatchNorm layer, by name


class MaskedBatchNorm(nn.Module):
    """`nn.BatchNorm{1,2,3}d` in training mode over the real samples of one row; the same parameter and buffer
    names, so the source module's state loads unchanged. A `FeatureBatchNorm` row of one sample (a
    `SpatialBatchNorm` row of one value per channel) is normalized with the running statistics and moves none, as
    in the sequential trainer, with one difference: within a step, the sequential trainer of a client whose tasks
    have inputs of their own runs one pass per task, and a later pass moves the statistics that an earlier
    one-sample pass read (its backward then reads the moved ones) or that a later one-sample pass reads. Here every
    pass of a step reads the statistics the step began with."""

    def __init__(self, source: nn.modules.batchnorm._BatchNorm, name: str, context: NormContext) -> None:
        super().__init__()
        self.name = name
        if source.momentum is None or not source.track_running_stats:
            raise Unbatchable("a BatchNorm layer keeps a cumulative average (momentum None) or no running statistics")
        self.weight, self.bias = source.weight, source.bias
        self.register_buffer("running_mean", source.running_mean)
        self.register_buffer("running_var", source.running_var)
        self.register_buffer("num_batches_tracked", source.num_batches_tracked)
        self.eps, self.momentum = source.eps, source.momentum
        self.single_uses_running = isinstance(source, FeatureBatchNorm | SpatialBatchNorm)
        self.context = context

    def forward(self, x: Tensor) -> Tensor:
        mask = self.context.mask
        assert mask is not None, "the batched executor sets the rows' mask before every forward pass"
        count = mask.sum() * x[0, 0].numel()  # real elements per channel: samples × elements of one sample's channel
        affine = None if self.weight is None else (self.weight, self.bias)
        out, stats = masked_batch_norm(
            x, mask.view(-1, *([1] * (x.dim() - 1))), count, [0, *range(2, x.dim())],
            (1, -1, *([1] * (x.dim() - 2))), self.eps, affine,
            (self.running_mean, self.running_var) if self.single_uses_running else None)
        if self.name in self.context.stats:
            raise Unbatchable(f"BatchNorm layer {self.name} runs twice in one forward pass")
        self.context.stats[self.name] = stats
        return out


def masked_batch_norm(x: Tensor, weights: Tensor, count: Tensor, dims: list[int], channel: tuple[int, ...],
                      eps: float, affine: tuple[Tensor, Tensor] | None, single: tuple[Tensor, Tensor] | None,
                      ) -> tuple[Tensor, Statistics]:
    """BatchNorm in training mode over the samples `weights` marks (1 real, 0 padding; broadcastable against x),
    reducing `dims`, with `count` real elements per channel (a scalar, or one per channel) and `channel` the view
    that puts a per-channel tensor against x; `affine` is (weight, bias) per channel. `single`: the running (mean,
    var) that normalize a batch of one sample (a `FeatureBatchNorm`), whose statistics then do not move.
    Returns the output and (batch mean, unbiased variance, 1 where the running statistics move)."""
    safe = count.clamp(min=1)
    mean = (x * weights).sum(dims) / safe
    centred = x - mean.view(channel)
    variance = (centred.pow(2) * weights).sum(dims) / safe
    out = centred * torch.rsqrt(variance + eps).view(channel)
    if single is not None:  # one sample has no batch variance: the running statistics normalize it
        running_mean, running_var = single
        normalized = (x - running_mean.view(channel)) * torch.rsqrt(running_var + eps).view(channel)
        out = torch.where((count == 1).view(channel) if count.dim() else count == 1, normalized, out)
    if affine is not None:
        out = out * affine[0].view(channel) + affine[1].view(channel)
    unbiased = variance * safe / (safe - 1).clamp(min=1)
    moves = (count > 1) if single is not None else (count > 0)
    return out, (mean, unbiased, moves.to(x.dtype))


def masked_copy(module: nn.Module, context: NormContext) -> nn.Module:
    """A deep copy of `module` whose BatchNorm layers are `MaskedBatchNorm`s reading `context`, each named by its
    path in `module`; the source is left as it is."""
    copied = copy.deepcopy(module)
    for path, child in list(copied.named_modules()):
        if isinstance(child, nn.SyncBatchNorm):
            raise Unbatchable("SyncBatchNorm synchronizes statistics across processes")
        if isinstance(child, nn.modules.batchnorm._BatchNorm):
            parent, _, name = path.rpartition(".")
            setattr(copied.get_submodule(parent), name, MaskedBatchNorm(child, path, context))
    return copied
