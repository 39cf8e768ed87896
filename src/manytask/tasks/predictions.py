"""Example predictions for the picture grid of a dense run: the first few test images of each dense task, caught
while the run's final evaluation makes them, whatever method or model makes them.

The engine opens `recording_predictions(count)` around the last evaluation; `evaluate` offers every batch it
scores, and the first batch of a task that reaches the recorder wins (a method that scores several views of one
task scores its main model first). Evaluation in another process (a Flower client) records nothing here, and the
report then has no grid to draw.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from torch import Tensor

from manytask.tasks.task import TaskSpec

INPUTS, TARGETS, OUTPUTS = "inputs", "targets", "outputs"


class PredictionRecorder:
    def __init__(self, count: int) -> None:
        self.count = count
        self.examples: dict[str, dict[str, Tensor]] = {}

    def offer(self, spec: TaskSpec, x: Tensor, y: Tensor, outputs: Tensor) -> None:
        if spec.is_dense and spec.name not in self.examples:
            keep = slice(0, self.count)
            self.examples[spec.name] = {
                INPUTS: x[keep].detach().clone(), TARGETS: y[keep].detach().clone(),
                OUTPUTS: outputs[keep].detach().float().clone(),
            }

    def flat(self) -> dict[str, Tensor]:
        """`<task>/<inputs|targets|outputs>` -> tensor, the form the run directory stores."""
        return {f"{task}/{part}": value for task, parts in self.examples.items() for part, value in parts.items()}


_RECORDER: ContextVar[PredictionRecorder | None] = ContextVar("manytask_prediction_recorder", default=None)


@contextmanager
def recording_predictions(count: int) -> Iterator[PredictionRecorder]:
    recorder = PredictionRecorder(count)
    token = _RECORDER.set(recorder)
    try:
        yield recorder
    finally:
        _RECORDER.reset(token)


def record_prediction(spec: TaskSpec, x: Tensor, y: Tensor, outputs: Tensor) -> None:
    """Offer one scored batch to the active recorder, if any (a no-op otherwise)."""
    recorder = _RECORDER.get()
    if recorder is not None:
        recorder.offer(spec, x, y, outputs)


def split_predictions(flat: dict[str, Tensor]) -> dict[str, dict[str, Tensor]]:
    """Inverse of `PredictionRecorder.flat`."""
    examples: dict[str, dict[str, Tensor]] = {}
    for key, value in flat.items():
        task, part = key.rsplit("/", 1)
        examples.setdefault(task, {})[part] = value
    return examples
