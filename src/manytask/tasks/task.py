"""A `Task`: a named learning problem with its data, output spec, loss and metrics."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

import torch
import torch.nn.functional as F
from torch import Tensor

from manytask.tasks.dense_losses import ALTERNATIVES, dense_loss
from manytask.tasks.dense_metrics import (
    DepthMeter,
    L1Meter,
    Meter,
    NormalsMeter,
    SegmentationMeter,
    edge_meter,
    saliency_meter,
)


class TaskKind(str, Enum):
    CLASSIFICATION = "classification"
    REGRESSION = "regression"
    # Dense kinds: outputs (N, C, H, W) at the input's resolution; targets per kind (see `tasks/dense_losses.py`).
    SEGMENTATION = "segmentation"
    DEPTH = "depth"
    NORMALS = "normals"
    EDGES = "edges"
    SALIENCY = "saliency"
    HEATMAP = "heatmap"
    RECONSTRUCTION = "reconstruction"


@dataclass(frozen=True)
class KindInfo:
    """How a kind is scored: its main metric (first of `metrics`) and whether higher is better."""

    metrics: tuple[str, ...]
    higher_is_better: bool
    dense: bool = True


KINDS: dict[TaskKind, KindInfo] = {
    TaskKind.CLASSIFICATION: KindInfo(("accuracy", "loss"), True, dense=False),
    TaskKind.REGRESSION: KindInfo(("mse", "loss"), False, dense=False),
    TaskKind.SEGMENTATION: KindInfo(("miou", "pixel_accuracy", "loss"), True),
    TaskKind.DEPTH: KindInfo(("rmse", "mae", "loss"), False),
    TaskKind.NORMALS: KindInfo(
        ("mean_angle", "median_angle", "within_11_25", "within_22_5", "within_30", "loss"), False
    ),
    TaskKind.EDGES: KindInfo(("odsf", "odsf_threshold", "loss"), True),
    TaskKind.SALIENCY: KindInfo(("maxf", "maxf_threshold", "loss"), True),
    TaskKind.HEATMAP: KindInfo(("l1", "loss"), False),
    TaskKind.RECONSTRUCTION: KindInfo(("l1", "loss"), False),
}


@dataclass(frozen=True)
class TaskSpec:
    """What a model needs to know about a task (no data): its name, kind and output size (classes, or the
    channels of a dense output)."""

    name: str
    kind: TaskKind
    num_outputs: int
    loss_choice: str | None = None  # a named alternative to the kind's training loss (`dense_losses.ALTERNATIVES`)

    def __post_init__(self) -> None:
        if self.loss_choice is None:
            return
        if self.loss_choice not in ALTERNATIVES:
            raise ValueError(f"task '{self.name}': unknown loss '{self.loss_choice}'; choose from "
                             f"{', '.join(ALTERNATIVES)}")
        kinds = ALTERNATIVES[self.loss_choice][0]
        if self.kind.value not in kinds:
            raise ValueError(f"task '{self.name}': loss '{self.loss_choice}' is for {' or '.join(sorted(kinds))} "
                             f"tasks, not {self.kind.value}")

    @property
    def is_dense(self) -> bool:
        """Whether the task predicts a map at the input's resolution (a decoder head) rather than a vector."""
        return KINDS[self.kind].dense

    def loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        """Mean loss of a batch: cross-entropy for classification, MSE for regression, the kind's loss for dense
        tasks, or the chosen alternative."""
        if self.loss_choice is not None:
            return ALTERNATIVES[self.loss_choice][1](outputs, targets)
        if self.kind is TaskKind.CLASSIFICATION:
            return F.cross_entropy(outputs, targets)
        if self.kind is TaskKind.REGRESSION:
            return F.mse_loss(outputs, targets.view_as(outputs))
        return dense_loss(self.kind, outputs, targets)

    @property
    def metric_names(self) -> tuple[str, ...]:
        return KINDS[self.kind].metrics

    @property
    def main_metric(self) -> str:
        """The metric tables and averages use (accuracy, mse, miou, rmse, mean_angle, odsf, maxf, l1)."""
        return self.metric_names[0]

    @property
    def higher_is_better(self) -> bool:
        """Whether a larger main metric is better (accuracy, mIoU, F) or worse (errors): the sign s_t of a Δ%."""
        return KINDS[self.kind].higher_is_better

    @property
    def chance(self) -> float | None:
        """Accuracy of a uniform guess (a floor for 'learned something'); None for other kinds."""
        return 1.0 / self.num_outputs if self.kind is TaskKind.CLASSIFICATION else None

    def meter(self) -> TaskMeter:
        """A fresh accumulator of this task's metrics over a whole test set."""
        return TaskMeter(self, _kind_meter(self))


class TaskMeter:
    """Accumulates a task's metrics batch by batch; `result()` gives them for everything seen. Metrics that need
    the whole test set (mIoU from a confusion matrix, odsF at one threshold for the dataset) keep sufficient
    statistics, so the batch size never changes a number."""

    def __init__(self, spec: TaskSpec, inner: Meter) -> None:
        self.spec = spec
        self.inner = inner
        self.loss_sum = 0.0
        self.count = 0

    def update(self, outputs: Tensor, targets: Tensor) -> None:
        self.loss_sum += float(self.spec.loss(outputs, targets)) * len(targets)
        self.count += len(targets)
        self.inner.update(outputs, targets)

    def result(self) -> dict[str, float]:
        return {**self.inner.result(), "loss": self.loss_sum / max(self.count, 1)}


class _SampleMeter(Meter):
    """Classification accuracy or regression MSE: means over samples."""

    def __init__(self, kind: TaskKind) -> None:
        self.kind = kind
        self.total = 0.0
        self.count = 0

    def update(self, outputs: Tensor, targets: Tensor) -> None:
        if self.kind is TaskKind.CLASSIFICATION:
            self.total += float((outputs.argmax(dim=1) == targets).sum())
        else:
            self.total += float(F.mse_loss(outputs, targets.view_as(outputs))) * len(targets)
        self.count += len(targets)

    def result(self) -> dict[str, float]:
        name = "accuracy" if self.kind is TaskKind.CLASSIFICATION else "mse"
        return {name: self.total / max(self.count, 1)}


def _kind_meter(spec: TaskSpec) -> Meter:
    kind = spec.kind
    if kind in (TaskKind.CLASSIFICATION, TaskKind.REGRESSION):
        return _SampleMeter(kind)
    if kind is TaskKind.SEGMENTATION:
        return SegmentationMeter(spec.num_outputs)
    if kind is TaskKind.DEPTH:
        return DepthMeter()
    if kind is TaskKind.NORMALS:
        return NormalsMeter()
    if kind is TaskKind.EDGES:
        return edge_meter()
    if kind is TaskKind.SALIENCY:
        return saliency_meter()
    return L1Meter()


@dataclass
class Task:
    """A task with its train and test tensors. Inputs of all tasks in one benchmark share a shape."""

    spec: TaskSpec
    x_train: Tensor
    y_train: Tensor
    x_test: Tensor
    y_test: Tensor
    description: str = ""
    metadata: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.x_train) != len(self.y_train) or len(self.x_test) != len(self.y_test):
            raise ValueError(f"task '{self.name}': inputs and targets differ in length")
        if self.spec.kind in (TaskKind.CLASSIFICATION, TaskKind.SEGMENTATION):
            self.y_train = self.y_train.long()
            self.y_test = self.y_test.long()

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])

    @property
    def num_train(self) -> int:
        return len(self.y_train)

    @property
    def labels(self) -> Tensor | None:
        """Training labels for label-based partitioners (None for regression and dense tasks)."""
        return self.y_train if self.spec.kind is TaskKind.CLASSIFICATION else None


def classification_task(
    name: str, x_train: Tensor, y_train: Tensor, x_test: Tensor, y_test: Tensor, num_classes: int | None = None,
    description: str = "",
) -> Task:
    """Shortcut for a classification task; the class count defaults to max label + 1."""
    if num_classes is None:
        num_classes = int(torch.cat([y_train, y_test]).max()) + 1
    spec = TaskSpec(name, TaskKind.CLASSIFICATION, num_classes)
    return Task(spec, x_train.float(), y_train, x_test.float(), y_test, description=description)


def dense_task(
    name: str, kind: TaskKind, x_train: Tensor, y_train: Tensor, x_test: Tensor, y_test: Tensor, num_outputs: int,
    description: str = "",
) -> Task:
    """A dense task: inputs (N, C, H, W) images, targets per the kind's contract (`tasks/dense_losses.py`)."""
    spec = TaskSpec(name, TaskKind(kind), num_outputs)
    if not spec.is_dense:
        raise ValueError(f"task '{name}': {kind} is not a dense kind")
    return Task(spec, x_train, y_train, x_test, y_test, description=description)
