"""Dense-task metric accumulators against hand-computed values, and their independence from batching."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

from manytask.seeding import torch_generator
from manytask.tasks.dense_metrics import (
    IGNORE_INDEX,
    BinaryMapMeter,
    DepthMeter,
    L1Meter,
    Meter,
    NormalsMeter,
    SegmentationMeter,
    confusion_matrix,
    edge_meter,
    mean_iou,
    pixel_accuracy,
    saliency_meter,
)

# Six pixels of one (1, 1, 1, 6) map: probabilities and ground truth (see the F tables in the tests below).
PROBS = [0.9, 0.8, 0.7, 0.6, 0.5, 0.2]
TRUTH = [1.0, 0.0, 0.0, 1.0, 1.0, 0.0]


def _row(values: list[float]) -> torch.Tensor:
    """A (1, 1, 1, K) float map."""
    return torch.tensor(values).view(1, 1, 1, -1)


def _one_hot_logits(pred: list[int], num_classes: int) -> torch.Tensor:
    """(1, C, 1, K) logits whose argmax over classes is `pred`."""
    return torch.nn.functional.one_hot(torch.tensor(pred), num_classes).float().T.reshape(1, num_classes, 1, -1)


def _normals(vectors: list[tuple[float, float, float]]) -> torch.Tensor:
    """(1, 3, 1, K) normals, one pixel per vector."""
    return torch.tensor(vectors).T.reshape(1, 3, 1, -1)


# --- segmentation ----------------------------------------------------------------------------------------------

# Four classes: class 2 occurs in the truth but is never predicted (IoU 0); class 3 occurs nowhere (skipped);
# the last pixel is unlabeled, so its prediction (class 2) counts nowhere.
SEG_TRUTH = [0, 0, 1, 1, 2, IGNORE_INDEX]
SEG_PRED = [0, 1, 1, 1, 0, 2]


def test_confusion_matrix_skips_ignored_pixels() -> None:
    confusion = confusion_matrix(torch.tensor(SEG_PRED), torch.tensor(SEG_TRUTH), num_classes=4)
    expected = [[1, 1, 0, 0], [0, 2, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0]]
    assert confusion.dtype == torch.int64
    assert confusion.tolist() == expected


def test_mean_iou_skips_absent_classes_and_counts_missed_ones() -> None:
    confusion = confusion_matrix(torch.tensor(SEG_PRED), torch.tensor(SEG_TRUTH), num_classes=4)
    # IoU_0 = 1 / (2 + 2 - 1), IoU_1 = 2 / (2 + 3 - 2), IoU_2 = 0 / 1; class 3 has an empty union.
    assert mean_iou(confusion) == pytest.approx((1 / 3 + 2 / 3 + 0) / 3)
    assert pixel_accuracy(confusion) == pytest.approx(3 / 5)


def test_mean_iou_counts_a_predicted_class_absent_from_the_truth() -> None:
    confusion = torch.tensor([[1, 1], [0, 0]])  # class 1 predicted once, never true: IoU_1 = 0
    assert mean_iou(confusion) == pytest.approx(0.25)


def test_segmentation_meter_takes_the_argmax_of_logits() -> None:
    meter = SegmentationMeter(4)
    meter.update(_one_hot_logits(SEG_PRED, 4), torch.tensor([SEG_TRUTH]).view(1, 1, -1))
    assert meter.result() == pytest.approx({"miou": 1 / 3, "pixel_accuracy": 3 / 5})


def test_out_of_range_targets_and_wrong_class_count_raise() -> None:
    with pytest.raises(ValueError, match="target class id 4"):
        confusion_matrix(torch.tensor([0, 1]), torch.tensor([0, 4]), num_classes=4)
    with pytest.raises(ValueError, match="not \\(N, 3, H, W\\)"):
        SegmentationMeter(3).update(torch.zeros(1, 4, 1, 2), torch.zeros(1, 1, 2, dtype=torch.int64))


def test_empty_segmentation_is_nan() -> None:
    meter = SegmentationMeter(2)
    meter.update(torch.zeros(1, 2, 1, 2), torch.full((1, 1, 2), IGNORE_INDEX))
    assert all(math.isnan(value) for value in meter.result().values())


# --- depth -----------------------------------------------------------------------------------------------------


def test_depth_pools_valid_pixels_over_the_dataset() -> None:
    meter = DepthMeter()
    meter.update(_row([3.0, 100.0, 1.0, 1.0]), _row([2.0, 0.0, 4.0, 1.0]))  # errors 1, (masked), 3, 0
    assert meter.result() == pytest.approx({"rmse": math.sqrt(10 / 3), "mae": 4 / 3})
    meter.update(_row([5.0, 9.0, 9.0, 9.0]), _row([1.0, 0.0, 0.0, 0.0]))  # error 4 on its one valid pixel
    # Pooled over 4 valid pixels, not the mean of the two images' RMSEs.
    assert meter.result() == pytest.approx({"rmse": math.sqrt(26 / 4), "mae": 8 / 4})


# --- normals ---------------------------------------------------------------------------------------------------


def _degrees(angle: float) -> tuple[float, float, float]:
    """A unit vector at `angle` degrees from +z."""
    return (math.sin(math.radians(angle)), 0.0, math.cos(math.radians(angle)))


def test_normals_angles_for_known_vectors() -> None:
    z, x = (0.0, 0.0, 1.0), (1.0, 0.0, 0.0)
    pred = [(0.0, 0.0, 2.0), _degrees(20), _degrees(25), (1.0, 1.0, 0.0), (0.0, 5.0, 0.0), (0.0, 0.0, -1.0),
            (1.0, 0.0, 0.0)]
    truth = [z, z, z, x, z, z, (0.0, 0.0, 0.0)]  # angles 0, 20, 25, 45, 90, 180; the last pixel is invalid
    meter = NormalsMeter()
    meter.update(_normals(pred), _normals(truth))
    result = meter.result()
    assert result["mean_angle"] == pytest.approx(360 / 6, abs=1e-4)
    assert result["median_angle"] == pytest.approx((25 + 45) / 2, abs=0.01)
    assert result["within_11_25"] == pytest.approx(1 / 6)
    assert result["within_22_5"] == pytest.approx(2 / 6)
    assert result["within_30"] == pytest.approx(3 / 6)


def test_normals_median_of_an_odd_count_and_zero_prediction() -> None:
    meter = NormalsMeter()
    z = (0.0, 0.0, 1.0)
    meter.update(_normals([_degrees(10), (0.0, 0.0, 0.0), _degrees(60)]), _normals([z, z, z]))  # 10°, 90°, 60°
    result = meter.result()
    assert result["median_angle"] == pytest.approx(60, abs=0.01)
    assert result["mean_angle"] == pytest.approx(160 / 3, abs=1e-4)


# --- edges and saliency ----------------------------------------------------------------------------------------


def _binary_result(meter: BinaryMapMeter) -> dict[str, float]:
    meter.update(torch.logit(_row(PROBS)), _row(TRUTH))
    return meter.result()


def test_ods_f_picks_the_best_dataset_threshold() -> None:
    # Positives predicted at τ (3 true positives in all):      F1 = 2TP / (2TP + FN + FP)
    #   τ in (0.8, 0.9]: {.9}                TP 1 FP 0 FN 2     2/4
    #   τ in (0.7, 0.8]: {.9 .8}             TP 1 FP 1 FN 2     2/5
    #   τ in (0.6, 0.7]: {.9 .8 .7}          TP 1 FP 2 FN 2     2/6
    #   τ in (0.5, 0.6]: {.9 .8 .7 .6}       TP 2 FP 2 FN 1     4/7
    #   τ in (0.2, 0.5]: {... .5}            TP 3 FP 2 FN 0     6/8   <- best; lowest grid τ is 0.21
    #   τ in (0, 0.2]:   all                 TP 3 FP 3 FN 0     6/9
    assert _binary_result(edge_meter()) == pytest.approx({"odsf": 0.75, "odsf_threshold": 0.21})


def test_max_f_with_beta2_03_prefers_precision() -> None:
    # F = 1.3 TP / (1.3 TP + 0.3 FN + FP): {.9}: 1.3/1.9 = 0.684 beats {... .5}: 3.9/5.9 = 0.661, so τ = 0.81.
    assert _binary_result(saliency_meter()) == pytest.approx({"maxf": 13 / 19, "maxf_threshold": 0.81})


def test_binary_map_ties_go_to_the_lowest_threshold() -> None:
    # Grid 0.25, 0.5, 0.75: both 0.25 and 0.5 predict {.9 .8 .7 .6 .5} (p ≥ τ), F1 = 6/8.
    result = _binary_result(BinaryMapMeter("f", beta2=1.0, thresholds=3))
    assert result == pytest.approx({"f": 0.75, "f_threshold": 0.25})


def test_binary_map_without_positives_scores_zero() -> None:
    meter = edge_meter()
    meter.update(torch.full((1, 1, 2, 2), -20.0), torch.zeros(1, 1, 2, 2))
    assert meter.result()["odsf"] == 0.0


# --- l1 --------------------------------------------------------------------------------------------------------


def test_l1_is_the_mean_over_all_elements() -> None:
    meter = L1Meter()
    meter.update(torch.tensor([[[[1.0, 2.0]], [[3.0, 4.0]]]]), torch.tensor([[[[0.0, 2.0]], [[5.0, 4.0]]]]))
    assert meter.result() == pytest.approx({"l1": 3 / 4})


# --- batching never changes a number ----------------------------------------------------------------------------


def _segmentation_data(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    targets = torch.randint(0, 4, (10, 5, 6), generator=gen)
    targets[torch.rand(10, 5, 6, generator=gen) < 0.2] = IGNORE_INDEX
    return torch.randn(10, 4, 5, 6, generator=gen), targets


def _depth_data(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    targets = torch.rand(10, 1, 5, 6, generator=gen) * 10
    targets[torch.rand(10, 1, 5, 6, generator=gen) < 0.3] = 0
    return torch.rand(10, 1, 5, 6, generator=gen) * 10, targets


def _normals_data(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    targets = torch.nn.functional.normalize(torch.randn(10, 3, 5, 6, generator=gen), dim=1)
    targets *= (torch.rand(10, 1, 5, 6, generator=gen) > 0.2).float()
    return torch.randn(10, 3, 5, 6, generator=gen), targets


def _binary_data(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(10, 1, 5, 6, generator=gen), (torch.rand(10, 1, 5, 6, generator=gen) < 0.3).float()


def _l1_data(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(10, 2, 5, 6, generator=gen), torch.randn(10, 2, 5, 6, generator=gen)


CASES: dict[str, tuple[Callable[[], Meter], Callable[[torch.Generator], tuple[torch.Tensor, torch.Tensor]]]] = {
    "segmentation": (lambda: SegmentationMeter(4), _segmentation_data),
    "depth": (DepthMeter, _depth_data),
    "normals": (NormalsMeter, _normals_data),
    "edges": (edge_meter, _binary_data),
    "saliency": (saliency_meter, _binary_data),
    "l1": (L1Meter, _l1_data),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_one_batch_and_many_batches_give_the_same_numbers(case: str) -> None:
    make_meter, make_data = CASES[case]
    outputs, targets = make_data(torch_generator(0, "dense-metrics", case))
    whole, pieces = make_meter(), make_meter()
    whole.update(outputs, targets)
    for out, tgt in zip(outputs.split([3, 1, 6]), targets.split([3, 1, 6]), strict=True):
        pieces.update(out, tgt)
    expected = whole.result()
    assert all(math.isfinite(value) for value in expected.values())
    assert pieces.result() == pytest.approx(expected, rel=1e-12)
