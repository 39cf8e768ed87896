"""Each task kind's loss over one padded row of a batched round, equal to `TaskSpec.loss` on the row's real samples.

A row is one client's mini-batch padded to the batch size; `weight` holds 1/n on its n real samples and 0 on the
padding. A per-sample kind's loss is Σ weight · (the sample's loss). A dense kind's loss is a mean over the labelled
pixels of the batch, not a mean of per-sample means (`tasks/dense_losses.py`), so its row loss sums over the real
samples' labelled pixels and divides by their count. Nothing here branches on values: one row or a `vmap` over many
runs the same ops, with no host sync."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from manytask.tasks.dense_losses import shifted_l1_per_sample
from manytask.tasks.dense_metrics import IGNORE_INDEX
from manytask.tasks.task import TaskKind, TaskSpec

RowLoss = Callable[[Tensor, Tensor, Tensor], Tensor]  # (outputs, targets, weight (batch,)) -> the row's loss


def _per_sample(outputs: Tensor, weight: Tensor) -> Tensor:
    """`weight` broadcast over each sample's elements (N, 1, ...)."""
    return weight.view(-1, *([1] * (outputs.dim() - 1)))


def _labelled_mean(values: Tensor, labelled: Tensor, weight: Tensor) -> Tensor:
    """Mean of `values` over the labelled elements of the real samples; 0 (with a zero gradient) where there are
    none, as `dense_losses._masked_mean` gives."""
    chosen = labelled & (_per_sample(values, weight) > 0)
    return torch.where(chosen, values, 0.0).sum() / chosen.sum().clamp(min=1)


def _real_mean(values: Tensor, weight: Tensor) -> Tensor:
    """Mean of `values` over every element of the real samples."""
    real = _per_sample(values, weight) > 0
    return torch.where(real, values, 0.0).sum() / (real.sum() * values[0].numel()).clamp(min=1)


def cross_entropy(outputs: Tensor, targets: Tensor, weight: Tensor) -> Tensor:
    return (F.cross_entropy(outputs, targets, reduction="none") * weight).sum()


def squared_error(outputs: Tensor, targets: Tensor, weight: Tensor) -> Tensor:
    return ((outputs - targets.view_as(outputs)).pow(2).flatten(1).mean(1) * weight).sum()


def segmentation(outputs: Tensor, targets: Tensor, weight: Tensor) -> Tensor:
    targets = targets.long()
    labelled = targets != IGNORE_INDEX
    pixel = F.cross_entropy(outputs, torch.where(labelled, targets, 0), reduction="none")
    return _labelled_mean(pixel, labelled, weight)


def depth(outputs: Tensor, targets: Tensor, weight: Tensor) -> Tensor:
    return _labelled_mean((outputs - targets).abs(), targets > 0, weight)


def normals(outputs: Tensor, targets: Tensor, weight: Tensor) -> Tensor:
    labelled = (targets.abs().sum(dim=1, keepdim=True) > 0).expand_as(targets)
    return _labelled_mean((F.normalize(outputs, dim=1) - targets).abs(), labelled, weight)


def balanced_bce(outputs: Tensor, targets: Tensor, weight: Tensor) -> Tensor:
    """`dense_losses.balanced_bce_loss` with the positive fraction taken over the real samples."""
    real = (_per_sample(targets, weight) > 0).to(targets.dtype)
    positive = (targets * real).sum() / (real.sum() * targets[0].numel()).clamp(min=1)
    weights = torch.where(targets > 0.5, 1.0 - positive, positive)
    return _real_mean(F.binary_cross_entropy_with_logits(outputs, targets, weight=weights, reduction="none"), weight)


def l1(outputs: Tensor, targets: Tensor, weight: Tensor) -> Tensor:
    return _real_mean((outputs - targets).abs(), weight)


def map_l1(outputs: Tensor, targets: Tensor, weight: Tensor) -> Tensor:
    return _real_mean((torch.sigmoid(outputs) - targets).abs(), weight)


def shifted_l1(outputs: Tensor, targets: Tensor, weight: Tensor) -> Tensor:
    return (shifted_l1_per_sample(outputs, targets) * weight).sum()


def row_loss(spec: TaskSpec) -> RowLoss:
    """The row loss of a task's training loss: its chosen alternative's, or its kind's."""
    return ALTERNATIVE_ROW_LOSSES[spec.loss_choice] if spec.loss_choice is not None else ROW_LOSSES[spec.kind]


ALTERNATIVE_ROW_LOSSES: dict[str, RowLoss] = {"map-l1": map_l1, "shifted-l1": shifted_l1}
ROW_LOSSES: dict[TaskKind, RowLoss] = {
    TaskKind.CLASSIFICATION: cross_entropy, TaskKind.REGRESSION: squared_error,
    TaskKind.SEGMENTATION: segmentation, TaskKind.DEPTH: depth, TaskKind.NORMALS: normals,
    TaskKind.EDGES: balanced_bce, TaskKind.SALIENCY: balanced_bce, TaskKind.HEATMAP: l1,
    TaskKind.RECONSTRUCTION: l1,
}
