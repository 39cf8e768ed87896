"""The picture grid of a dense run: for a few test images, the input and each dense task's truth and prediction,
read from the run directory's `predictions.safetensors` (written at the run's last evaluation).

Each kind is drawn the way people read it: class maps in a qualitative palette (ignored pixels black), depth in
one colour scale shared by truth and prediction, normals as RGB = (n + 1)/2, edges and saliency as probabilities,
heatmaps and reconstructions as images (the first channel when there are not three)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from matplotlib.axes import Axes
from safetensors.torch import load_file
from torch import Tensor

from manytask.report.plots import new_figure, save_figure
from manytask.report.runs import RunRecord
from manytask.tasks.dense_metrics import IGNORE_INDEX
from manytask.tasks.predictions import INPUTS, OUTPUTS, TARGETS, split_predictions

PREDICTIONS = "predictions.safetensors"


def _image(x: Tensor) -> np.ndarray:
    """(C, H, W) → an (H, W, 3) or (H, W) array for imshow."""
    x = x.detach().float()
    return x.permute(1, 2, 0).clamp(0, 1).numpy() if x.shape[0] == 3 else x[0].numpy()


def _classes(labels: Tensor, num_classes: int) -> np.ndarray:
    colors = np.array([[0, 0, 0], *(_palette(i) for i in range(num_classes))], dtype=np.float32)
    index = torch.where(labels == IGNORE_INDEX, 0, labels.long() + 1).clamp(0, num_classes).numpy()
    return colors[index]


def _palette(i: int) -> tuple[float, float, float]:
    from matplotlib import colormaps

    return tuple(colormaps["tab20"](i % 20)[:3])


def _normals(n: Tensor) -> np.ndarray:
    n = torch.nn.functional.normalize(n.float(), dim=0)
    return ((n + 1) / 2).permute(1, 2, 0).clamp(0, 1).numpy()


def _pair(kind: str, truth: Tensor, output: Tensor) -> tuple[np.ndarray, np.ndarray, dict]:
    """(truth picture, prediction picture, imshow options) of one example."""
    if kind == "segmentation":
        classes = output.shape[0]
        return _classes(truth, classes), _classes(output.argmax(dim=0), classes), {}
    if kind == "normals":
        valid = truth.abs().sum(dim=0, keepdim=True) > 0
        return _normals(truth) * valid.permute(1, 2, 0).numpy(), _normals(output), {}
    if kind in ("edges", "saliency"):
        return truth[0].numpy(), torch.sigmoid(output[0].float()).numpy(), {"cmap": "gray", "vmin": 0, "vmax": 1}
    if kind == "depth":
        valid = truth[0][truth[0] > 0]
        low, high = (float(valid.min()), float(valid.max())) if len(valid) else (0.0, 1.0)
        return truth[0].numpy(), output[0].float().numpy(), {"cmap": "viridis", "vmin": low, "vmax": high}
    if truth.shape[0] == 3:
        return _image(truth), _image(output), {}
    low, high = float(truth[0].min()), float(truth[0].max())
    return truth[0].numpy(), output[0].float().numpy(), {"cmap": "magma", "vmin": low, "vmax": max(high, low + 1e-6)}


def _show(axes: Axes, picture: np.ndarray, title: str, options: dict) -> None:
    axes.imshow(picture, interpolation="nearest", **({"cmap": "gray"} if picture.ndim == 2 and not options else
                                                     options))
    axes.set_xticks([])
    axes.set_yticks([])
    if title:
        axes.set_title(title, fontsize=7)


def plot_prediction_grid(record: RunRecord, path: str | Path) -> Path | None:
    """Rows = test images; columns = the input, then truth and prediction of every dense task. None when the run
    kept no predictions (no dense task, or evaluation ran in other processes)."""
    source = record.path / PREDICTIONS
    if not source.is_file():
        return None
    examples = split_predictions(load_file(str(source)))
    kinds = record.summary.get("task_kinds") or {}
    tasks = [t for t in examples if t in kinds]
    if not tasks:
        return None
    count = min(len(examples[t][INPUTS]) for t in tasks)
    columns = 1 + 2 * len(tasks)
    figure = new_figure((1.1 * columns, 1.2 * count + 0.4))
    for row in range(count):
        first = row == 0
        _show(figure.add_subplot(count, columns, row * columns + 1), _image(examples[tasks[0]][INPUTS][row]),
              "input" if first else "", {})
        for index, task in enumerate(tasks):
            truth, output = examples[task][TARGETS][row], examples[task][OUTPUTS][row]
            pictures = _pair(kinds[task], truth, output)
            base = row * columns + 2 + 2 * index
            _show(figure.add_subplot(count, columns, base), pictures[0], f"{task} truth" if first else "", pictures[2])
            _show(figure.add_subplot(count, columns, base + 1), pictures[1], f"{task} pred." if first else "",
                  pictures[2])
    return save_figure(figure, path)
