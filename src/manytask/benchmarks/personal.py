"""What the personal-task benchmarks (`label-skew`, `rotated-masked-digits`) share: the single-task dataset they
carve up (`source`) and the construction of one task per client, named `client00`, `client01`, ...

Sources: `digits` (scikit-learn's 8x8 digits, split by `test_fraction`), `mnist1d` (generated signals, 80/20),
`cifar10`, `mnist` and `fashion-mnist` (official files under `root`, their own train/test split; Fashion-MNIST's
`root` defaults to the Debian package's folder). `max_train` / `max_test` subsample a source's training / test set
before any client gets its share.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from pydantic import Field
from torch import Tensor

from manytask.benchmarks.base import Benchmark
from manytask.benchmarks.cifar10 import load_cifar10
from manytask.benchmarks.digits import load_images, stratified_split
from manytask.benchmarks.fashion_mnist import DEFAULT_ROOT as FASHION_MNIST_ROOT
from manytask.benchmarks.fashion_mnist import load_fashion_mnist
from manytask.benchmarks.local_files import Arrays, take_subset
from manytask.benchmarks.mnist import load_mnist
from manytask.benchmarks.mnist1d import Mnist1dParams, generate
from manytask.errors import ManytaskError
from manytask.registry import Params
from manytask.seeding import numpy_rng
from manytask.tasks.task import Task, classification_task

FILE_LOADERS: dict[str, tuple[str, Callable[[Path], Arrays]]] = {
    "cifar10": ("CIFAR-10", load_cifar10),
    "mnist": ("MNIST", load_mnist),
    "fashion-mnist": ("Fashion-MNIST", load_fashion_mnist),
}
DEFAULT_ROOTS = {"fashion-mnist": FASHION_MNIST_ROOT}  # used when `root` is not given
LABELS = {"digits": "8x8 digits", "mnist1d": "mnist1d signals", "cifar10": "CIFAR-10 images",
          "mnist": "28x28 MNIST digits", "fashion-mnist": "28x28 Fashion-MNIST clothing images"}
NUM_CLASSES = 10  # every source has 10 classes
MNIST1D_KEYS = ("x", "y", "x_test", "y_test")


class SourceParams(Params):
    """Where a personal-task benchmark's data come from; subclasses narrow `source` to the ones they support."""

    source: str = Field("digits", description="the single-task dataset the clients' data are drawn from")
    root: str | None = Field(None, description="folder of the source's files (cifar10, mnist, fashion-mnist)")
    max_train: int | None = Field(None, ge=1, description="subsample the source's training set")
    max_test: int | None = Field(None, ge=1, description="subsample the source's test set")
    test_fraction: float = Field(0.25, gt=0, lt=1, description="digits source: share of the images for testing")


@dataclass(frozen=True)
class Source:
    """A single-task dataset: float32 inputs and int64 labels, its own train/test split."""

    label: str
    x_train: Tensor
    y_train: Tensor
    x_test: Tensor
    y_test: Tensor
    num_classes: int = NUM_CLASSES


def load_source(
    name: str, params: SourceParams, seed: int, benchmark: str, num_samples: int = Mnist1dParams().num_samples
) -> Source:
    """The source `name`, split and subsampled by seeds derived for `benchmark`; `num_samples` is for mnist1d."""
    x_train, y_train, x_test, y_test = _arrays(name, params, seed, benchmark, num_samples)
    x_train, y_train = take_subset(x_train, y_train, params.max_train, numpy_rng(seed, benchmark, "train"))
    x_test, y_test = take_subset(x_test, y_test, params.max_test, numpy_rng(seed, benchmark, "test"))
    return Source(LABELS[name], x_train, y_train, x_test, y_test)


def _arrays(name: str, params: SourceParams, seed: int, benchmark: str, num_samples: int) -> Arrays:
    if name == "digits":
        images, labels = load_images()
        train, test = stratified_split(labels, params.test_fraction, numpy_rng(seed, benchmark, "split"))
        x, y = torch.from_numpy(images), torch.from_numpy(labels)
        return x[train], y[train], x[test], y[test]
    if name == "mnist1d":
        data = generate(num_samples, seed)
        x_train, y_train, x_test, y_test = (torch.from_numpy(np.asarray(data[k])) for k in MNIST1D_KEYS)
        return x_train.float(), y_train.long(), x_test.float(), y_test.long()
    title, load = FILE_LOADERS[name]
    root = params.root if params.root is not None else DEFAULT_ROOTS.get(name)
    if root is None:
        raise ManytaskError(
            f"benchmark '{benchmark}' with source '{name}' needs 'root', the folder of the {title} files."
        )
    return load(Path(root).expanduser())


def client_name(client: int) -> str:
    return f"client{client:02d}"


def personal_task(client: int, arrays: Arrays, num_classes: int, description: str) -> Task:
    """Client `client`'s own task: its training and local test data, over the source's full label space."""
    return classification_task(client_name(client), *arrays, num_classes=num_classes, description=description)


def personal_benchmark(
    name: str, tasks: Sequence[Task], groups: Sequence[int], description: str, metadata: dict | None = None
) -> Benchmark:
    """One task per client; `groups[i]` is the true group of client i (metadata `groups`, by task name)."""
    named = {task.name: task for task in tasks}
    group_of = {task.name: int(group) for task, group in zip(tasks, groups, strict=True)}
    return Benchmark(name, named, description, {"groups": group_of, **(metadata or {})})
