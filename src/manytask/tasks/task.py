"""A `Task`: a named learning problem with its data, output spec, loss and metrics."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

import torch
import torch.nn.functional as F
from torch import Tensor


class TaskKind(str, Enum):
    CLASSIFICATION = "classification"
    REGRESSION = "regression"


@dataclass(frozen=True)
class TaskSpec:
    """What a model needs to know about a task (no data): its name, kind and output size."""

    name: str
    kind: TaskKind
    num_outputs: int

    def loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        """Mean loss of a batch: cross-entropy for classification, MSE for regression."""
        if self.kind is TaskKind.CLASSIFICATION:
            return F.cross_entropy(outputs, targets)
        return F.mse_loss(outputs, targets.view_as(outputs))

    @property
    def metric_names(self) -> tuple[str, ...]:
        return ("accuracy", "loss") if self.kind is TaskKind.CLASSIFICATION else ("mse", "loss")

    @property
    def main_metric(self) -> str:
        """The metric tables and averages use; higher is better for accuracy, lower for mse."""
        return self.metric_names[0]

    @property
    def higher_is_better(self) -> bool:
        """Whether a larger main metric is better (accuracy) or worse (mse): the sign s_t of a Δ%."""
        return self.kind is TaskKind.CLASSIFICATION

    @property
    def chance(self) -> float | None:
        """Accuracy of a uniform guess (a floor for 'learned something'); None for regression."""
        return 1.0 / self.num_outputs if self.kind is TaskKind.CLASSIFICATION else None

    def batch_metrics(self, outputs: Tensor, targets: Tensor) -> dict[str, float]:
        """Sums over the batch (not means), so batches can be added up and divided once."""
        loss_sum = float(self.loss(outputs, targets)) * len(targets)
        if self.kind is TaskKind.CLASSIFICATION:
            correct = float((outputs.argmax(dim=1) == targets).sum())
            return {"accuracy": correct, "loss": loss_sum}
        return {"mse": loss_sum, "loss": loss_sum}


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
        if self.spec.kind is TaskKind.CLASSIFICATION:
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
        """Training labels for label-based partitioners (None for regression)."""
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
