"""A Hugging Face dataset on disk as a manytask benchmark: write one with `save_to_disk` (the pictures of
custom_dataset.py as an `Image` column with two `ClassLabel` columns, `shape` and `size`), then run FedAvg on it from
Python with `benchmark: {name: hf, path: DIR}`, one task per label column.

    python examples/hf_dataset.py OUT_DIR        # needs the hf extra: pip install 'manytask[hf]'
"""

from __future__ import annotations

import sys
from pathlib import Path

import datasets
from custom_dataset import ShapeRows  # this folder's example rows

import manytask

FEATURES = datasets.Features({"image": datasets.Image(),
                              "shape": datasets.ClassLabel(names=["square", "disc", "cross"]),
                              "size": datasets.ClassLabel(names=["small", "large"])})


def save_shapes(folder: Path) -> Path:
    """A DatasetDict with train and test splits, written with save_to_disk."""
    splits = {}
    for split, (count, seed) in {"train": (1200, 0), "test": (400, 1)}.items():
        rows = ShapeRows(count, seed)
        splits[split] = datasets.Dataset.from_list([rows[i] for i in range(len(rows))], features=FEATURES)
    datasets.DatasetDict(splits).save_to_disk(str(folder))
    return folder


def main(out: Path) -> manytask.RunResult:
    data = save_shapes(out / "shapes-hf")
    return manytask.run({
        "name": "hf-example", "method": "fedavg",
        "benchmark": {"name": "hf", "path": str(data)},  # tasks: every ClassLabel column (shape, size)
        "federation": {"num_clients": 6, "tasks": {"kind": "dirichlet", "zeta": 1.0},
                       "samples": {"kind": "label-skew"}},
        "model": {"backbone": "cnn", "channels": [8, 16], "hidden": 32},
        "train": {"optimizer": "sgd", "lr": 0.01, "momentum": 0.9, "local_epochs": 2, "batch_size": 32},
        "rounds": 10, "eval_every": 5, "reference": None,
    }, out / "run")


if __name__ == "__main__":
    result = main(Path(sys.argv[1]))
    for task, metrics in result.summaries["fedavg"]["tasks"].items():
        print(f"{task}: accuracy {metrics['accuracy']:.3f}")
    print(f"run directory: {result.path}")
