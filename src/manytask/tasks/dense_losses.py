"""Training losses of the dense task kinds, each the mean over the pixels that carry a label.

Target contract (outputs are always (N, C, H, W) at the input's resolution):
- segmentation: (N, H, W) int64 class ids, `IGNORE_INDEX` (255) = unlabeled; cross-entropy over labeled pixels.
- depth: (N, 1, H, W) metres (or any unit), 0 = no measurement; L1 over measured pixels.
- normals: (N, 3, H, W) unit vectors, all-zero = no label; L1 between the L2-normalized prediction and the target.
- edges, saliency: (N, 1, H, W) in {0, 1}; class-balanced BCE on logits (positives weighted by the batch's negative
  fraction, negatives by its positive fraction), because edge pixels are a few percent of an image.
- heatmap, reconstruction: same shape as the outputs; L1.
A batch with no labeled pixel gives a zero loss that still depends on the outputs (no NaN, no graph break).

Alternatives a task may train with instead (`TaskSpec.loss_choice`, set by `train.losses`), the losses of the
task-grouping code that MAS and TAG released for Taskonomy (docs/mas.md):
- "map-l1" (edges, saliency): L1 between the predicted map σ(output) and the target over every pixel. The released
  code regresses the raw output; the σ keeps the edge metrics, which threshold σ(output), reading it as they do
  under BCE (the minimizer, each pixel's conditional median, is the same).
- "shifted-l1" (normals): per sample, the mean over the target's interior (1 pixel in from each side) of
  labelled·|output − target|, taken at each of the output's 9 shifts by at most one pixel, and the least of the 9;
  its mean over the batch. The raw output (not normalized), every interior pixel in the mean (unlabelled ones add
  0), as released.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from manytask.tasks.dense_metrics import IGNORE_INDEX


def _masked_mean(values: Tensor, mask: Tensor, outputs: Tensor) -> Tensor:
    """Mean of `values` where `mask` holds; 0·Σoutputs when nothing is labeled."""
    if not bool(mask.any()):
        return outputs.sum() * 0.0
    return values[mask].mean()


def segmentation_loss(outputs: Tensor, targets: Tensor) -> Tensor:
    if not bool((targets != IGNORE_INDEX).any()):
        return outputs.sum() * 0.0
    return F.cross_entropy(outputs, targets.long(), ignore_index=IGNORE_INDEX)


def depth_loss(outputs: Tensor, targets: Tensor) -> Tensor:
    return _masked_mean((outputs - targets).abs(), targets > 0, outputs)


def normals_loss(outputs: Tensor, targets: Tensor) -> Tensor:
    valid = (targets.abs().sum(dim=1, keepdim=True) > 0).expand_as(targets)
    return _masked_mean((F.normalize(outputs, dim=1) - targets).abs(), valid, outputs)


def balanced_bce_loss(outputs: Tensor, targets: Tensor) -> Tensor:
    """Σ_pixels w·BCE / #pixels with w = 1 − positive fraction on positives and the positive fraction on negatives
    (the HED weighting), so the rare class is not drowned out."""
    positive = targets.mean()
    weights = torch.where(targets > 0.5, 1.0 - positive, positive)
    return F.binary_cross_entropy_with_logits(outputs, targets, weight=weights)


def l1_loss(outputs: Tensor, targets: Tensor) -> Tensor:
    return F.l1_loss(outputs, targets)


_LOSSES = {
    "segmentation": segmentation_loss,
    "depth": depth_loss,
    "normals": normals_loss,
    "edges": balanced_bce_loss,
    "saliency": balanced_bce_loss,
    "heatmap": l1_loss,
    "reconstruction": l1_loss,
}


def map_l1_loss(outputs: Tensor, targets: Tensor) -> Tensor:
    return F.l1_loss(torch.sigmoid(outputs), targets)


def shifted_l1_per_sample(outputs: Tensor, targets: Tensor) -> Tensor:
    """Per sample (N,): the least over the output's 9 one-pixel shifts of the labelled L1 mean on the target's
    interior ("shifted-l1" above)."""
    height, width = outputs.shape[-2:]
    if height < 3 or width < 3:
        raise ValueError(f"shifted-l1 needs maps of at least 3×3 pixels, got {height}×{width}")
    target = targets[:, :, 1:-1, 1:-1]
    labelled = (target.abs().sum(dim=1, keepdim=True) > 0).to(target.dtype)
    shifted = [outputs[:, :, 1 + dy : height - 1 + dy, 1 + dx : width - 1 + dx]
               for dy in (-1, 0, 1) for dx in (-1, 0, 1)]
    return torch.stack([((s - target).abs() * labelled).mean(dim=(1, 2, 3)) for s in shifted]).amin(dim=0)


def shifted_l1_loss(outputs: Tensor, targets: Tensor) -> Tensor:
    return shifted_l1_per_sample(outputs, targets).mean()


# name -> (the kinds it applies to, the loss of one batch)
ALTERNATIVES = {
    "map-l1": (frozenset({"edges", "saliency"}), map_l1_loss),
    "shifted-l1": (frozenset({"normals"}), shifted_l1_loss),
}


def dense_loss(kind: str, outputs: Tensor, targets: Tensor) -> Tensor:
    """The loss of a dense kind (its `TaskKind` value) on one batch."""
    return _LOSSES[str(getattr(kind, "value", kind))](outputs, targets)
