"""The shared shape of a one-task benchmark read from local files (CIFAR-10, MNIST): a root directory (by default
the download cache), the official files fetched into it on request (`download: true`), and optional, seeded
subsampling of the train and test sets."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from pydantic import Field
from torch import Tensor

from manytask.benchmarks.base import Benchmark
from manytask.benchmarks.download import DATASETS, cache_root, fetch
from manytask.errors import ManytaskError
from manytask.registry import Params
from manytask.seeding import numpy_rng
from manytask.tasks.task import classification_task

Arrays = tuple[Tensor, Tensor, Tensor, Tensor]


class LocalFilesParams(Params):
    root: str | None = Field(None, description="folder of the files; default: $MANYTASK_CACHE/datasets/<benchmark>")
    download: bool = Field(False, description="fetch the official files into root when absent (checksums checked)")
    max_train: int | None = Field(None, ge=1)
    max_test: int | None = Field(None, ge=1)

    def folder(self, name: str) -> Path:
        """The folder benchmark `name` reads: `root`, or its download cache when `root` is not given."""
        return Path(self.root).expanduser() if self.root is not None else cache_root(name)


def ensure_files(name: str, root: Path, download: bool, find: Callable[[Path], object]) -> None:
    """Fetch benchmark `name`'s official files into `root` when `find` misses them and `download` is set; without
    `download`, `find`'s one-sentence error, which then also says how to have them fetched."""
    try:
        find(root)
    except ManytaskError as err:
        if not download:
            raise ManytaskError(f"{str(err).removesuffix('.')}; set download: true to fetch them into {root}.") \
                from None
        fetch(DATASETS[name], root)


def take_subset(x: Tensor, y: Tensor, limit: int | None, rng: np.random.Generator) -> tuple[Tensor, Tensor]:
    """At most `limit` random items of `(x, y)`, kept in their original order; all of them when `limit` is None."""
    if limit is None or limit >= len(y):
        return x, y
    keep = torch.from_numpy(np.sort(rng.choice(len(y), size=limit, replace=False)))
    return x[keep], y[keep]


def single_task_benchmark(
    name: str, load: Callable[[Path], Arrays], params: LocalFilesParams, seed: int, description: str,
    metadata: dict | None = None, num_classes: int = 10, *, find: Callable[[Path], object],
) -> Benchmark:
    """One `num_classes`-class task `name` from the files under `params.folder(name)` (which `find` locates, or
    raises a one-sentence error), downloaded first where asked; subsampled by `seed`."""
    root = params.folder(name)
    ensure_files(name, root, params.download, find)
    x_train, y_train, x_test, y_test = load(root)
    x_train, y_train = take_subset(x_train, y_train, params.max_train, numpy_rng(seed, name, "train"))
    x_test, y_test = take_subset(x_test, y_test, params.max_test, numpy_rng(seed, name, "test"))
    task = classification_task(name, x_train, y_train, x_test, y_test, num_classes=num_classes,
                               description=f"{name}: {num_classes} classes from {root}")
    return Benchmark(name, {name: task}, description, {"root": str(root), **(metadata or {})})
