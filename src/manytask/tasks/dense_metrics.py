"""Dataset-level metrics of dense (per-pixel) tasks, as accumulators of sufficient statistics.

Dense metrics are not means of per-batch numbers: mIoU comes from one confusion matrix of the whole test set, RMSE
pools the squared errors of every valid pixel, odsF picks one threshold for the whole dataset. Each meter therefore
keeps counts and float64 sums (on the CPU, whatever device the batches come from) and divides once in `result()`,
so how the test set is batched never changes a number. A ratio with nothing to divide (no valid pixel seen) is nan.

Shapes follow the dense-task contract: outputs (N, C, H, W); targets (N, H, W) int64 class ids for segmentation
(IGNORE_INDEX = unlabeled), (N, C, H, W) float32 otherwise.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod

import torch
import torch.nn.functional as F
from torch import Tensor

IGNORE_INDEX = 255
"""Segmentation target of an unlabeled pixel: skipped by the loss and every metric."""

_ANGLE_BIN_DEGREES = 0.01
_ANGLE_BINS = round(180 / _ANGLE_BIN_DEGREES)
_ANGLE_THRESHOLDS = (11.25, 22.5, 30.0)
_ANGLE_METRICS = ("within_11_25", "within_22_5", "within_30")


class Meter(ABC):
    """Accumulates one task's metrics over a test set, batch by batch; `result()` covers everything seen."""

    @abstractmethod
    def update(self, outputs: Tensor, targets: Tensor) -> None:
        """Add one batch of raw model outputs and their targets."""

    @abstractmethod
    def result(self) -> dict[str, float]:
        """The metrics of all batches added so far."""


def _check_same_shape(outputs: Tensor, targets: Tensor) -> None:
    if outputs.shape != targets.shape:
        raise ValueError(f"outputs of shape {tuple(outputs.shape)} do not match targets of shape "
                         f"{tuple(targets.shape)}")


def _ratio(numerator: float, denominator: float) -> float:
    """numerator / denominator, nan when the denominator is 0 (nothing was measured)."""
    return numerator / denominator if denominator else math.nan


def _sum64(values: Tensor) -> float:
    """Sum in float64, so a dataset-long accumulation does not lose float32 precision."""
    return float(values.to(torch.float64).sum())


# --- segmentation ----------------------------------------------------------------------------------------------


def confusion_matrix(pred: Tensor, target: Tensor, num_classes: int, ignore_index: int = IGNORE_INDEX) -> Tensor:
    """The (C, C) int64 confusion matrix M[i, j] = #pixels of true class i predicted as class j.

    Pixels whose target is `ignore_index` are skipped. Any other target (or any prediction) outside [0, C) raises
    ValueError: a label the model cannot output means the data and `num_classes` disagree, and silently dropping
    such pixels would inflate every score.
    """
    _check_same_shape(pred, target)
    labeled = target != ignore_index
    truth, guess = target[labeled].long(), pred[labeled].long()
    for name, ids in (("target", truth), ("prediction", guess)):
        bad = (ids < 0) | (ids >= num_classes)
        if bool(bad.any()):
            raise ValueError(f"{name} class id {int(ids[bad][0])} is outside [0, {num_classes}) "
                             f"and is not the ignore index {ignore_index}")
    counts = torch.bincount(truth * num_classes + guess, minlength=num_classes * num_classes)
    return counts.reshape(num_classes, num_classes).cpu()


def mean_iou(confusion: Tensor) -> float:
    """mIoU = mean over classes c with a non-empty union of IoU_c = M[c,c] / (Σ_j M[c,j] + Σ_i M[i,c] − M[c,c]).

    A class absent from both truth and prediction (union 0) has no defined IoU and is skipped; a class that occurs
    in the truth but is never predicted (or is predicted but never occurs) has IoU 0 and counts.
    """
    confusion = confusion.to(torch.float64)
    hits = confusion.diagonal()
    union = confusion.sum(dim=0) + confusion.sum(dim=1) - hits
    present = union > 0
    return float((hits[present] / union[present]).mean()) if bool(present.any()) else math.nan


def pixel_accuracy(confusion: Tensor) -> float:
    """Pixel accuracy = Σ_c M[c,c] / Σ_ij M[i,j]: the fraction of labeled pixels given their true class."""
    return _ratio(float(confusion.diagonal().sum()), float(confusion.sum()))


class SegmentationMeter(Meter):
    """mIoU and pixel accuracy of argmax predictions, from one confusion matrix over the whole test set.

    outputs (N, C, H, W) logits, targets (N, H, W) class ids with IGNORE_INDEX for unlabeled pixels.
    """

    def __init__(self, num_classes: int) -> None:
        self.num_classes = num_classes
        self.confusion = torch.zeros(num_classes, num_classes, dtype=torch.int64)

    def update(self, outputs: Tensor, targets: Tensor) -> None:
        if outputs.dim() != 4 or outputs.shape[1] != self.num_classes:
            raise ValueError(f"segmentation outputs of shape {tuple(outputs.shape)} are not (N, {self.num_classes}, "
                             "H, W) logits")
        self.confusion += confusion_matrix(outputs.detach().argmax(dim=1), targets, self.num_classes)

    def result(self) -> dict[str, float]:
        return {"miou": mean_iou(self.confusion), "pixel_accuracy": pixel_accuracy(self.confusion)}


# --- depth -----------------------------------------------------------------------------------------------------


class DepthMeter(Meter):
    """Depth errors pooled over every valid pixel of the dataset (target > 0; 0 means "no measurement"):

    rmse = sqrt(Σ (ŷ − y)² / n_valid),  mae = Σ |ŷ − y| / n_valid.

    Pooling (rather than averaging per-image RMSEs) weights each measured pixel equally, so images with sparse
    depth count for what they measure.
    """

    def __init__(self) -> None:
        self.squared = 0.0
        self.absolute = 0.0
        self.count = 0

    def update(self, outputs: Tensor, targets: Tensor) -> None:
        _check_same_shape(outputs, targets)
        valid = targets > 0
        errors = outputs.detach()[valid] - targets[valid]
        self.squared += _sum64(errors.square())
        self.absolute += _sum64(errors.abs())
        self.count += int(valid.sum())

    def result(self) -> dict[str, float]:
        return {"rmse": math.sqrt(_ratio(self.squared, self.count)), "mae": _ratio(self.absolute, self.count)}


# --- surface normals -------------------------------------------------------------------------------------------


def angular_error(outputs: Tensor, targets: Tensor) -> Tensor:
    """Per-pixel angle in degrees between (N, 3, ...) predicted and target normals, both L2-normalized first:
    θ = atan2(|p̂ × t̂|, p̂ · t̂), which (unlike acos of the dot product) stays accurate near 0° and 180°.

    An all-zero prediction has no direction; it gets 90° (the angle a random direction makes on average), not the
    0° atan2(0, 0) would give, so a zero-initialized head cannot score as perfect.
    """
    pred = F.normalize(outputs, dim=1)
    true = F.normalize(targets, dim=1)
    sine = torch.linalg.cross(pred, true, dim=1).norm(dim=1)
    cosine = (pred * true).sum(dim=1)
    degenerate = (sine == 0) & (cosine == 0)
    return torch.where(degenerate, 90.0, torch.rad2deg(torch.atan2(sine, cosine)))


class NormalsMeter(Meter):
    """Angular errors θ (degrees, see `angular_error`) over valid pixels (target not all-zero) of the dataset:

    mean_angle = Σ θ / n;  within_t = #{θ < t} / n for t in 11.25°, 22.5°, 30° (fractions in [0, 1]);
    median_angle from a histogram of 0.01° bins (memory fixed, whatever the dataset size): the midpoint of the
    bin holding the middle rank (the mean of both middle ranks' bins for even n), within 0.005° of the exact median.
    """

    def __init__(self) -> None:
        self.histogram = torch.zeros(_ANGLE_BINS, dtype=torch.int64)
        self.within = torch.zeros(len(_ANGLE_THRESHOLDS), dtype=torch.int64)
        self.angle_sum = 0.0

    def update(self, outputs: Tensor, targets: Tensor) -> None:
        _check_same_shape(outputs, targets)
        if outputs.dim() < 2 or outputs.shape[1] != 3:
            raise ValueError(f"normals of shape {tuple(outputs.shape)} do not have 3 channels in dim 1")
        valid = targets.ne(0).any(dim=1)
        # float64: float32 rounding of the angles would depend on the batch's memory layout (vectorized tails).
        angles = angular_error(outputs.detach().to(torch.float64), targets.to(torch.float64))[valid]
        bins = (angles / _ANGLE_BIN_DEGREES).long().clamp(0, _ANGLE_BINS - 1)
        self.histogram += torch.bincount(bins, minlength=_ANGLE_BINS).cpu()
        limits = torch.tensor(_ANGLE_THRESHOLDS, dtype=angles.dtype, device=angles.device)
        self.within += (angles[:, None] < limits).sum(dim=0).cpu()
        self.angle_sum += _sum64(angles)

    def _median(self) -> float:
        count = int(self.histogram.sum())
        if count == 0:
            return math.nan
        cumulative = self.histogram.cumsum(dim=0)
        middle_ranks = torch.tensor([(count + 1) // 2, count // 2 + 1])
        bins = torch.searchsorted(cumulative, middle_ranks)
        return float((bins.to(torch.float64) + 0.5).mean()) * _ANGLE_BIN_DEGREES

    def result(self) -> dict[str, float]:
        count = int(self.histogram.sum())
        fractions = {name: _ratio(int(hits), count) for name, hits in zip(_ANGLE_METRICS, self.within, strict=True)}
        return {"mean_angle": _ratio(self.angle_sum, count), "median_angle": self._median(), **fractions}


# --- binary maps (edges, saliency) -----------------------------------------------------------------------------


class BinaryMapMeter(Meter):
    """Best F-measure over a fixed threshold grid, with TP/FP/FN pooled over the whole dataset.

    Probabilities p = sigmoid(logit); a pixel is predicted positive at threshold τ_i = i / (thresholds + 1),
    i = 1..thresholds, when p ≥ τ_i; a target pixel is positive when ≥ 0.5. With P = TP / (TP + FP) and
    R = TP / (TP + FN) counted over all pixels of all images,

        F_β(τ) = (1 + β²) · P · R / (β² · P + R)  = (1 + β²) TP / ((1 + β²) TP + β² FN + FP),  0 when P + R = 0,

    and the result is {metric: max_τ F_β(τ), metric + "_threshold": the maximizing τ (the lowest on a tie)}.
    Each pixel is bucketed once by how many thresholds it reaches, so the per-threshold counts are reverse cumulative
    sums of two histograms (no loop over thresholds).
    """

    def __init__(self, metric: str, beta2: float, thresholds: int = 99) -> None:
        if beta2 <= 0 or thresholds < 1:
            raise ValueError(f"BinaryMapMeter needs beta2 > 0 and thresholds ≥ 1, got {beta2} and {thresholds}")
        self.metric = metric
        self.beta2 = beta2
        self.taus = torch.arange(1, thresholds + 1, dtype=torch.float64) / (thresholds + 1)
        self.positives = torch.zeros(thresholds + 1, dtype=torch.int64)
        self.negatives = torch.zeros(thresholds + 1, dtype=torch.int64)

    def update(self, outputs: Tensor, targets: Tensor) -> None:
        _check_same_shape(outputs, targets)
        probs = torch.sigmoid(outputs.detach())
        reached = torch.bucketize(probs, self.taus.to(probs), right=True)  # number of τ_i ≤ p
        positive = targets >= 0.5
        size = len(self.taus) + 1
        self.positives += torch.bincount(reached[positive], minlength=size).cpu()
        self.negatives += torch.bincount(reached[~positive], minlength=size).cpu()

    def f_scores(self) -> Tensor:
        """F_β at every threshold τ_1..τ_T (float64)."""
        tp = self.positives.flip(0).cumsum(0).flip(0)[1:].to(torch.float64)
        fp = self.negatives.flip(0).cumsum(0).flip(0)[1:].to(torch.float64)
        fn = float(self.positives.sum()) - tp
        weighted = (1 + self.beta2) * tp
        denominator = weighted + self.beta2 * fn + fp
        return weighted / torch.where(denominator > 0, denominator, 1.0)  # 0 / 1 when nothing is positive at all

    def result(self) -> dict[str, float]:
        scores = self.f_scores()
        best = int(scores.argmax())
        return {self.metric: float(scores[best]), f"{self.metric}_threshold": float(self.taus[best])}


def edge_meter() -> BinaryMapMeter:
    """Edge detection's ODS F-measure ("odsf", β² = 1): one threshold for the whole dataset, 99 thresholds.

    Unlike the BSDS benchmark, edges are matched pixel to pixel: no thinning and no distance tolerance, so the
    numbers are stricter than (and not comparable with) published ODS scores.
    """
    return BinaryMapMeter("odsf", beta2=1.0)


def saliency_meter() -> BinaryMapMeter:
    """Saliency's max F-measure ("maxf") with the saliency literature's β² = 0.3, which weights precision more.

    Counts are pooled over the dataset; benchmarks that average per-image precision/recall curves can differ.
    """
    return BinaryMapMeter("maxf", beta2=0.3)


# --- heatmaps, reconstructions ---------------------------------------------------------------------------------


class L1Meter(Meter):
    """l1 = Σ |ŷ − y| / #elements over every element of the dataset (keypoint heatmaps, reconstructions)."""

    def __init__(self) -> None:
        self.absolute = 0.0
        self.count = 0

    def update(self, outputs: Tensor, targets: Tensor) -> None:
        _check_same_shape(outputs, targets)
        self.absolute += _sum64((outputs.detach() - targets).abs())
        self.count += targets.numel()

    def result(self) -> dict[str, float]:
        return {"l1": _ratio(self.absolute, self.count)}
