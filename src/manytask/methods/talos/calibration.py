"""Which of a client's examples calibrate its TaLoS mask (shared/specs/talos_fl.md): `count` examples stratified to
the client's own label distribution. An IID client of a 100-class task with `count = 100` gets about one example
per class (the paper's IID rule); a client with few classes gets its share of each of them (the non-IID rule)."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from manytask.client.trainer import TaskData
from manytask.federation.partition import apportion
from manytask.seeding import numpy_rng


def stratified_examples(y: Tensor, count: int, seed: int) -> Tensor:
    """Indices of min(count, len(y)) examples whose class counts follow y's (largest remainders), drawn without
    replacement within each class; sorted, deterministic in `seed`."""
    labels = y.cpu().numpy()
    classes, sizes = np.unique(labels, return_counts=True)
    wanted = apportion(min(count, len(labels)), sizes)
    rng = numpy_rng(seed, "calibration")
    chosen = [rng.choice(np.flatnonzero(labels == c), size=min(k, n), replace=False)
              for c, k, n in zip(classes, wanted, sizes, strict=True)]
    return torch.from_numpy(np.sort(np.concatenate(chosen)))


def calibration_batches(data: TaskData, count: int, seed: int) -> list[tuple[str, Tensor]]:
    """(task, inputs) per held task: `count` stratified examples of each."""
    return [(task, x[stratified_examples(y, count, seed).to(x.device)]) for task, (x, y) in data.items()]
