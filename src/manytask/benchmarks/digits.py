"""`digits-tasks`: tasks over scikit-learn's 8×8 digits, sharing one train/test split of the images.

Tasks differ by an input transform (rotation, inversion, a fixed pixel permutation) and/or a label map
(parity, mod 3, ≥5). The images are split once, so no test image is in any task's training set.

The seven classic tasks are the default selection. Three fixed pixel permutations, each crossed with the digit,
parity and mod-3 labels, give input *domains* that share nothing with each other or with the unpermuted images:
`permuted`, `permuted2`, `permuted3` and their `-parity` / `-mod3` variants. They make a benchmark of task
clusters (the tasks of one domain are related, tasks of different domains conflict), the shape of a many-task
benchmark built from different datasets.
"""

from __future__ import annotations

import gzip
import importlib.util
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from pydantic import Field

from manytask.benchmarks.base import Benchmark, check_named_tasks
from manytask.benchmarks.registry import register_benchmark
from manytask.registry import Params
from manytask.seeding import numpy_rng
from manytask.tasks.task import Task, classification_task

Images = np.ndarray  # (n, 1, 8, 8) float32 in [0, 1]


@dataclass(frozen=True)
class DigitsTaskDef:
    transform: str
    labels: str
    num_classes: int
    description: str
    permutation: int = 0  # which fixed pixel permutation (1, 2, 3) when transform == "permute"

    @property
    def domain(self) -> str:
        """Tasks of one domain see the same pixels; the unpermuted transforms keep the image's layout."""
        return f"permutation {self.permutation}" if self.transform == "permute" else "spatial"


TASKS: dict[str, DigitsTaskDef] = {
    "digit": DigitsTaskDef("identity", "digit", 10, "which digit (0-9)"),
    "rotated": DigitsTaskDef("rotate90", "digit", 10, "which digit, image rotated by 90 degrees"),
    "inverted": DigitsTaskDef("invert", "digit", 10, "which digit, image intensities inverted (1 - x)"),
    "parity": DigitsTaskDef("identity", "parity", 2, "is the digit odd (y mod 2)"),
    "mod3": DigitsTaskDef("identity", "mod3", 3, "the digit mod 3"),
    "ge5": DigitsTaskDef("identity", "ge5", 2, "is the digit at least 5"),
    "permuted": DigitsTaskDef("permute", "digit", 10, "which digit, pixels shuffled by a fixed permutation", 1),
}
DEFAULT_TASKS = tuple(TASKS)


def _permuted_domains() -> dict[str, DigitsTaskDef]:
    """`permuted{2,3}` and the parity / mod-3 labels of all three permutations (not in the default selection)."""
    labels = {"digit": (10, "which digit"), "parity": (2, "is the digit odd"), "mod3": (3, "the digit mod 3")}
    out = {}
    for k in (1, 2, 3):
        for kind, (classes, text) in labels.items():
            name = ("permuted" if k == 1 else f"permuted{k}") + ("" if kind == "digit" else f"-{kind}")
            if name not in TASKS:  # `permuted` itself is a classic task
                description = f"{text}, pixels shuffled by fixed permutation {k}"
                out[name] = DigitsTaskDef("permute", kind, classes, description, k)
    return out


TASKS |= _permuted_domains()

LABEL_MAPS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "digit": lambda y: y,
    "parity": lambda y: y % 2,
    "mod3": lambda y: y % 3,
    "ge5": lambda y: (y >= 5).astype(np.int64),
}


class DigitsParams(Params):
    tasks: list[str] = Field(default_factory=lambda: list(DEFAULT_TASKS))
    test_fraction: float = Field(0.25, gt=0, lt=1)
    holdout: float = Field(0.0, ge=0, lt=0.9, description="fraction of images no task uses: the pretraining source")


def load_images() -> tuple[Images, np.ndarray]:
    """All 1797 images as (n, 1, 8, 8) float32 in [0, 1], and their digit labels."""
    table = digits_table()
    images = (table[:, :64].reshape(-1, 8, 8) / 16.0).astype(np.float32)[:, None]
    return images, table[:, 64].astype(np.int64)


def digits_table() -> np.ndarray:
    """The 1797 × 65 table (64 pixels in 0..16, then the digit) of the CSV that scikit-learn ships, read directly:
    `sklearn.datasets.load_digits` reads the same file, but importing `sklearn.datasets` takes about 0.7 s, which a
    Flower deployment pays in every ClientApp process (one per message). A scikit-learn that moved its file is asked
    through its API."""
    spec = importlib.util.find_spec("sklearn")  # locates the package without importing it
    folders = spec.submodule_search_locations if spec is not None else None
    path = Path(folders[0]) / "datasets" / "data" / "digits.csv.gz" if folders else None
    if path is None or not path.is_file():
        from sklearn.datasets import load_digits

        data = load_digits()
        return np.column_stack([data.data, data.target])
    with gzip.open(path, "rt") as lines:
        return np.loadtxt(lines, delimiter=",")


def stratified_split(
    labels: np.ndarray, test_fraction: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Train and test indices; each class sends round(fraction·n_c) samples (≥1 each way) to test."""
    test = []
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        k = min(max(round(test_fraction * len(idx)), 1), len(idx) - 1)
        test.append(idx[:k])
    test_idx = np.sort(np.concatenate(test))
    return np.setdiff1d(np.arange(len(labels)), test_idx), test_idx


def transform_images(images: Images, kind: str, permutation: np.ndarray) -> Images:
    """Apply one input transform; the permutation is over the 64 pixels."""
    if kind == "rotate90":
        return np.ascontiguousarray(np.rot90(images, k=1, axes=(2, 3)))
    if kind == "invert":
        return 1.0 - images
    if kind == "permute":
        flat = images.reshape(len(images), -1)[:, permutation]
        return flat.reshape(images.shape)
    return images


def pixel_permutation(seed: int, index: int, size: int) -> np.ndarray:
    """Fixed permutation number `index` (1, 2, 3) of the pixels; number 1 is the one `permuted` always had."""
    stream = "permutation" if index == 1 else f"permutation {index}"
    return numpy_rng(seed, "digits", stream).permutation(size)


def relations(names: list[str]) -> dict[str, dict[str, list[str]]]:
    """Per selected task: the selected tasks of its domain are related (shared structure), the others conflict."""
    out = {}
    for name in names:
        domain = TASKS[name].domain
        out[name] = {
            "related": [t for t in names if t != name and TASKS[t].domain == domain],
            "conflicts": [t for t in names if TASKS[t].domain != domain],
        }
    return out


def domain_groups(names: list[str]) -> dict[str, int] | None:
    """The selected tasks' input domains as true task groups (task -> group index), when the selection is a set of
    clusters: two domains or more, each with two tasks or more. None otherwise (a lone task is no cluster)."""
    sizes = Counter(TASKS[name].domain for name in names)  # domains in order of first appearance
    if len(sizes) < 2 or min(sizes.values()) < 2:
        return None
    index = {domain: i for i, domain in enumerate(sizes)}
    return {name: index[TASKS[name].domain] for name in names}


def _make_task(
    name: str, images: Images, labels: np.ndarray, split: tuple[np.ndarray, np.ndarray],
    perms: dict[int, np.ndarray],
) -> Task:
    spec = TASKS[name]
    x = torch.from_numpy(transform_images(images, spec.transform, perms.get(spec.permutation, np.empty(0))))
    y = torch.from_numpy(LABEL_MAPS[spec.labels](labels))
    train, test = (torch.from_numpy(s) for s in split)
    return classification_task(name, x[train], y[train], x[test], y[test], spec.num_classes, spec.description)


@register_benchmark("digits-tasks", DigitsParams, "related/conflicting tasks over 8x8 digits (sklearn); 7 by default")
def digits_tasks(params: DigitsParams, seed: int) -> Benchmark:
    """Build the selected digits tasks over one seeded stratified split of the images."""
    check_named_tasks("digits-tasks", params.tasks, list(TASKS), "digits task")
    images, labels = load_images()
    source = None
    if params.holdout > 0:
        keep, held = stratified_split(labels, params.holdout, numpy_rng(seed, "digits", "holdout"))
        source = _source_task(images[held], labels[held], seed)
        images, labels = images[keep], labels[keep]
    split = stratified_split(labels, params.test_fraction, numpy_rng(seed, "digits", "split"))
    perms = {k: pixel_permutation(seed, k, images[0].size) for k in {TASKS[n].permutation for n in params.tasks} if k}
    tasks = {name: _make_task(name, images, labels, split, perms) for name in params.tasks}
    description = (
        "scikit-learn 8x8 digits: identity, rotated, inverted and pixel-permuted inputs; digit, parity, mod-3 "
        "and ≥5 labels; one train/test split of the images shared by all tasks"
    )
    metadata: dict[str, object] = {"relations": relations(params.tasks)}
    if (groups := domain_groups(params.tasks)) is not None:
        metadata["groups"] = groups
    return Benchmark("digits-tasks", tasks, description, metadata, source)


def _source_task(images: Images, labels: np.ndarray, seed: int) -> Task:
    """The held-out images labelled by digit: what a backbone is pretrained on before any task sees it."""
    train, test = stratified_split(labels, 0.2, numpy_rng(seed, "digits", "holdout-split"))
    x, y = torch.from_numpy(images), torch.from_numpy(labels)
    return classification_task("digit-source", x[train], y[train], x[test], y[test], 10, "held-out digits (source)")
