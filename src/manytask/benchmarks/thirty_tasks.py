"""`thirty-tasks`: 30 classification tasks over two offline image datasets at 8×8, the offline stand-in for the
30-task benchmark of MaTU's Fig. 4 and Fig. 5 (30 vision datasets there).

The datasets: scikit-learn's 8×8 digits (`digits`) and Fashion-MNIST averaged down to 8×8 (`fashion`, read from
the local IDX files of the `fashion-mnist` benchmark). Each gives fifteen tasks, every pair of an input and a
label space: the plain, rotated (90°), inverted (1 − x), mirrored and pixel-permuted (a fixed permutation of the
dataset's own) inputs, each with the ten classes, their parity and their mod 3 (`digits`, `digits-parity`,
`fashion-rotated-mod3`, ...). The tasks of one dataset share one train/test split of its images (no test image is
in any task's training set), so tasks differ by their inputs and their label spaces, as the paper's datasets do.

Metadata: `groups` gives each task its input domain (a dataset's unpermuted inputs, or its permuted ones: four
domains) where the selection is a set of such clusters, as `digits-tasks` does for its permutations, so reports can
score a clustering of task similarities against them. The pretraining source is held-out images of both datasets (20
classes, unpermuted), which no task uses: the backbone has seen both datasets before any task, as the paper's
ImageNet-21k backbone has seen natural images.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from pydantic import Field
from torch import Tensor

from manytask.benchmarks.base import Benchmark, check_named_tasks
from manytask.benchmarks.digits import load_images, stratified_split
from manytask.benchmarks.fashion_mnist import DEFAULT_ROOT, load_fashion_mnist
from manytask.benchmarks.mnist import find_idx_files
from manytask.benchmarks.registry import register_benchmark
from manytask.registry import Params
from manytask.seeding import numpy_rng
from manytask.tasks.task import Task, classification_task

DATASETS = ("digits", "fashion")
SIDE = 8  # every input is one 8×8 channel


@dataclass(frozen=True)
class Variant:
    """How a task is made from its dataset: an input transform and a label map."""

    transform: str
    labels: str
    num_classes: int


TRANSFORMS = {"": "identity", "-rotated": "rotate90", "-inverted": "invert", "-mirrored": "mirror",
              "-permuted": "permute"}
LABELS = {"": ("class", 10), "-parity": ("parity", 2), "-mod3": ("mod3", 3)}
VARIANTS: dict[str, Variant] = {f"{t}{label}": Variant(transform, kind, classes)
                                for t, transform in TRANSFORMS.items() for label, (kind, classes) in LABELS.items()}
TASKS: dict[str, tuple[str, Variant]] = {f"{d}{suffix}": (d, v) for d in DATASETS for suffix, v in VARIANTS.items()}

LABEL_MAPS: dict[str, Callable[[Tensor], Tensor]] = {
    "class": lambda y: y,
    "parity": lambda y: y % 2,
    "mod3": lambda y: y % 3,
}


class ThirtyTasksParams(Params):
    tasks: list[str] = Field(default_factory=lambda: list(TASKS), description="a selection of the 30 tasks")
    train_per_dataset: int = Field(600, ge=10, description="training samples of each dataset (its tasks share them)")
    test_per_dataset: int = Field(200, ge=10, description="test samples of each dataset")
    source_per_dataset: int = Field(400, ge=0, description="held-out samples of each dataset to pretrain on")
    fashion_root: str = Field(DEFAULT_ROOT, description="folder of the four Fashion-MNIST IDX files")


Split = tuple[Tensor, Tensor, Tensor, Tensor]  # x_train, y_train, x_test, y_test; x (n, 1, 8, 8) in [0, 1]


def _take(x: Tensor, y: Tensor, count: int, rng: np.random.Generator) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """`count` random samples of (x, y) in their order, and the rest."""
    chosen = np.zeros(len(y), dtype=bool)
    chosen[rng.choice(len(y), size=min(count, len(y)), replace=False)] = True
    keep, rest = torch.from_numpy(chosen), torch.from_numpy(~chosen)
    return x[keep], y[keep], x[rest], y[rest]


def shrink_to_8x8(images: Tensor) -> Tensor:
    """(n, 1, H, W) images in [0, 1] averaged down to (n, 1, 8, 8), still in [0, 1]."""
    return torch.nn.functional.adaptive_avg_pool2d(images, SIDE)


@lru_cache(maxsize=2)
def _fashion(root: str) -> Split:
    """Fashion-MNIST as 8×8 images, read once per process (the IDX files take seconds to read)."""
    folder = Path(root).expanduser()
    find_idx_files(folder, "Fashion-MNIST")  # one sentence naming the missing file
    x_train, y_train, x_test, y_test = load_fashion_mnist(folder)
    return shrink_to_8x8(x_train), y_train, shrink_to_8x8(x_test), y_test


def _digits(params: ThirtyTasksParams, seed: int) -> tuple[Split, Tensor, Tensor]:
    """The digits' task split and their held-out source images (with labels)."""
    images, labels = load_images()
    fraction = params.source_per_dataset / len(labels)
    rng = numpy_rng(seed, "thirty-tasks", "digits")
    if fraction > 0:
        keep, held = stratified_split(labels, min(fraction, 0.5), rng)
    else:
        keep, held = np.arange(len(labels)), np.arange(0)
    x, y = torch.from_numpy(images[keep]), torch.from_numpy(labels[keep])
    x_test, y_test, x_rest, y_rest = _take(x, y, params.test_per_dataset, rng)
    x_train, y_train, _, _ = _take(x_rest, y_rest, params.train_per_dataset, rng)
    return (x_train, y_train, x_test, y_test), torch.from_numpy(images[held]), torch.from_numpy(labels[held])


def _fashion_split(params: ThirtyTasksParams, seed: int) -> tuple[Split, Tensor, Tensor]:
    """Fashion-MNIST's task split (from its official train and test sets) and its held-out source images."""
    x_all, y_all, x_all_test, y_all_test = _fashion(params.fashion_root)
    rng = numpy_rng(seed, "thirty-tasks", "fashion")
    x_train, y_train, x_rest, y_rest = _take(x_all, y_all, params.train_per_dataset, rng)
    x_source, y_source, _, _ = _take(x_rest, y_rest, params.source_per_dataset, rng)
    x_test, y_test, _, _ = _take(x_all_test, y_all_test, params.test_per_dataset, rng)
    return (x_train, y_train, x_test, y_test), x_source, y_source


def transform(images: Tensor, kind: str, permutation: Tensor) -> Tensor:
    """One input transform of (n, 1, 8, 8) images; the permutation is over the 64 pixels."""
    if kind == "rotate90":
        return torch.rot90(images, 1, dims=(2, 3)).contiguous()
    if kind == "invert":
        return 1.0 - images
    if kind == "mirror":
        return torch.flip(images, dims=(3,)).contiguous()
    if kind == "permute":
        return images.reshape(len(images), -1)[:, permutation].reshape(images.shape)
    return images


def domain(name: str) -> str:
    """A task's input domain: its dataset's unpermuted inputs (`digits`), or its permuted ones (`digits-permuted`)."""
    dataset, variant = TASKS[name]
    return f"{dataset}-permuted" if variant.transform == "permute" else dataset


def domain_groups(names: list[str]) -> dict[str, int] | None:
    """The selected tasks' input domains as true task groups (task -> index, in order of first appearance) when
    the selection is a set of clusters: two domains or more, each with two tasks or more; else None."""
    domains = [domain(name) for name in names]
    order = list(dict.fromkeys(domains))
    if len(order) < 2 or min(domains.count(d) for d in order) < 2:
        return None
    return {name: order.index(d) for name, d in zip(names, domains, strict=True)}


def _make_task(name: str, split: Split, permutation: Tensor) -> Task:
    dataset, variant = TASKS[name]
    x_train, y_train, x_test, y_test = split
    label = LABEL_MAPS[variant.labels]
    description = f"{dataset}: {variant.labels} labels on {variant.transform} inputs"
    return classification_task(name, transform(x_train, variant.transform, permutation), label(y_train),
                                transform(x_test, variant.transform, permutation), label(y_test),
                                variant.num_classes, description)


def _source(pieces: list[tuple[Tensor, Tensor]], seed: int) -> Task | None:
    """The held-out images of every dataset that has some, classes numbered on from dataset to dataset."""
    xs, ys, offset = [], [], 0
    for x, y in pieces:
        if len(y):
            xs.append(x)
            ys.append(y + offset)
        offset += 10
    if not xs:
        return None
    x, y = torch.cat(xs), torch.cat(ys)
    train, test = stratified_split(y.numpy(), 0.2, numpy_rng(seed, "thirty-tasks", "source-split"))
    return classification_task("thirty-source", x[train], y[train], x[test], y[test], offset,
                               "held-out digits and Fashion-MNIST images (source)")


@register_benchmark("thirty-tasks", ThirtyTasksParams,
                    "30 tasks over 8x8 digits and Fashion-MNIST (MaTU's 30-task stand-in)")
def thirty_tasks(params: ThirtyTasksParams, seed: int) -> Benchmark:
    """Build the selected tasks; only the datasets they use are read (both when `source_per_dataset` > 0, as the
    pretraining source holds out images of each)."""
    check_named_tasks("thirty-tasks", params.tasks, list(TASKS), "thirty-tasks task")
    used = {TASKS[name][0] for name in params.tasks}
    splits: dict[str, Split] = {}
    held: list[tuple[Tensor, Tensor]] = []
    makers = {"digits": _digits, "fashion": _fashion_split}
    for dataset, make in makers.items():
        if dataset in used or params.source_per_dataset:  # the source holds out samples of every dataset
            splits[dataset], x_source, y_source = make(params, seed)
            held.append((x_source, y_source))
    perms = {d: torch.from_numpy(numpy_rng(seed, "thirty-tasks", "permutation", d).permutation(SIDE * SIDE))
             for d in DATASETS}
    tasks = {name: _make_task(name, splits[TASKS[name][0]], perms[TASKS[name][0]]) for name in params.tasks}
    metadata: dict[str, object] = {}
    if (groups := domain_groups(params.tasks)) is not None:
        metadata.update(groups=groups, domains=list(dict.fromkeys(domain(name) for name in params.tasks)))
    description = ("30 tasks over 8x8 digits and Fashion-MNIST averaged to 8x8: the classes, their parity and "
                   "their mod 3, each on plain, rotated, inverted, mirrored and pixel-permuted inputs")
    source = _source(held, seed) if params.source_per_dataset else None
    return Benchmark("thirty-tasks", tasks, description, metadata, source)
