"""Sample partitioners: split ONE task's training indices among the clients that hold it.

Each partitioner returns one index array per holder; together they use every sample exactly once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import Field, model_validator

from manytask.errors import ManytaskError
from manytask.registry import Params, Registry

MAX_DIRICHLET_ATTEMPTS = 100


def apportion(total: int, weights: np.ndarray, minimum: int = 0) -> np.ndarray:
    """Integer sizes summing to `total`, proportional to `weights` (largest remainder), each ≥ `minimum`.

    Needs `total ≥ minimum * len(weights)`."""
    weights = np.asarray(weights, dtype=np.float64)
    exact = weights / weights.sum() * total
    sizes = np.floor(exact).astype(np.int64)
    remainder = total - int(sizes.sum())
    order = np.argsort(-(exact - sizes), kind="stable")
    sizes[order[:remainder]] += 1
    while (sizes < minimum).any():
        sizes[np.argmax(sizes)] -= 1
        sizes[np.argmin(sizes)] += 1
    return sizes


def _split(indices: np.ndarray, sizes: np.ndarray) -> list[np.ndarray]:
    return np.split(indices, np.cumsum(sizes)[:-1])


def iid_partition(num_samples: int, shares: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    """A random split with sizes proportional to `shares`; every holder gets ≥1 sample when possible."""
    shares = np.asarray(shares, dtype=np.float64)
    minimum = 1 if num_samples >= len(shares) else 0
    return _split(rng.permutation(num_samples), apportion(num_samples, shares, minimum))


def _dirichlet_once(
    by_class: list[np.ndarray], shares: np.ndarray, zeta: float, rng: np.random.Generator
) -> list[np.ndarray]:
    parts: list[list[np.ndarray]] = [[] for _ in shares]
    for idx in by_class:
        p = rng.dirichlet(np.full(len(shares), zeta)) * shares
        p = p / p.sum() if np.isfinite(p).all() and p.sum() > 0 else shares
        cuts = (np.cumsum(p)[:-1] * len(idx)).astype(np.int64)
        for holder, piece in enumerate(np.split(rng.permutation(idx), cuts)):
            parts[holder].append(piece)
    return [np.concatenate(p) for p in parts]


def dirichlet_label_partition(
    labels: np.ndarray, shares: np.ndarray, zeta: float, rng: np.random.Generator, min_size: int = 1
) -> list[np.ndarray]:
    """Label skew: per class, proportions over holders ~ Dir(zeta·1) weighted by `shares`.

    Redraws (at most MAX_DIRICHLET_ATTEMPTS times) until every holder has ≥ `min_size` samples."""
    labels = np.asarray(labels)
    shares = np.asarray(shares, dtype=np.float64)
    if zeta <= 0:
        raise ManytaskError(f"the Dirichlet concentration zeta must be > 0, got {zeta}.")
    if min_size * len(shares) > len(labels):
        raise ManytaskError(
            f"cannot give each of {len(shares)} holders at least {min_size} of {len(labels)} samples; "
            "lower min_size or use fewer clients."
        )
    by_class = [np.flatnonzero(labels == c) for c in np.unique(labels)]
    for _ in range(MAX_DIRICHLET_ATTEMPTS):
        parts = _dirichlet_once(by_class, shares, zeta, rng)
        if min(len(p) for p in parts) >= min_size:
            return parts
    raise ManytaskError(
        f"Dirichlet label partition with zeta={zeta} left a holder with fewer than {min_size} samples "
        f"in {MAX_DIRICHLET_ATTEMPTS} attempts; raise zeta, lower min_size or use fewer clients."
    )


def label_shard_partition(
    labels: np.ndarray, num_holders: int, classes_per_client: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """McMahan-style shards: each holder gets `classes_per_client` single-class shards.

    Shards per class are proportional to the class size; shards are dealt round-robin in class order, so
    a holder's shards come from distinct classes whenever no class has more shards than there are holders."""
    labels = np.asarray(labels)
    classes = np.unique(labels)
    num_shards = num_holders * classes_per_client
    _check_shards(len(labels), len(classes), num_holders, classes_per_client)
    counts = np.array([(labels == c).sum() for c in classes])
    shards_per_class = apportion(num_shards, counts, minimum=1)
    shards: list[np.ndarray] = []
    for c in rng.permutation(len(classes)):
        idx = rng.permutation(np.flatnonzero(labels == classes[c]))
        shards.extend(np.array_split(idx, shards_per_class[c]))
    holder_of = rng.permutation(num_holders)
    parts: list[list[np.ndarray]] = [[] for _ in range(num_holders)]
    for j, shard in enumerate(shards):
        parts[holder_of[j % num_holders]].append(shard)
    return [np.concatenate(p) for p in parts]


def _check_shards(num_samples: int, num_classes: int, num_holders: int, per_client: int) -> None:
    num_shards = num_holders * per_client
    if per_client < 1 or per_client > num_classes:
        raise ManytaskError(f"classes_per_client must be between 1 and {num_classes} (the classes), got {per_client}.")
    if num_shards > num_samples:
        raise ManytaskError(
            f"{num_holders} holders × {per_client} classes per client = {num_shards} shards, "
            f"more than the {num_samples} samples; lower classes_per_client or use fewer clients."
        )
    if num_shards < num_classes:
        raise ManytaskError(
            f"{num_holders} holders × {per_client} classes per client = {num_shards} shards cannot cover "
            f"all {num_classes} classes; raise classes_per_client or use more clients."
        )


def natural_partition(groups: np.ndarray) -> list[np.ndarray]:
    """The samples of each group, one array per distinct group id in ascending order (ids 0..G−1: holder k gets
    group k)."""
    ids, inverse = np.unique(groups, return_inverse=True)
    return _split(np.argsort(inverse, kind="stable"), np.bincount(inverse, minlength=len(ids)))


@dataclass(frozen=True)
class TaskSamples:
    """What a partitioner sees of one task: name, sample count, labels (None: regression), holder shares, and the
    natural group of each sample (e.g. its building; None: the benchmark has no natural split)."""

    task: str
    num_samples: int
    labels: np.ndarray | None
    shares: np.ndarray
    groups: np.ndarray | None = None


SamplePartitioner = Callable[[TaskSamples, Any, np.random.Generator], list[np.ndarray]]
SAMPLE_PARTITIONERS: Registry[SamplePartitioner] = Registry("sample partitioner")


class DirichletParams(Params):
    zeta: float = Field(0.5, gt=0, description="the Dirichlet concentration; alpha (Flower's name) is a synonym")
    min_size: int = Field(1, ge=1)

    @model_validator(mode="before")
    @classmethod
    def _alpha_is_zeta(cls, values: Any) -> Any:
        """Read `alpha`, the concentration's name in Flower Datasets and most papers, as `zeta`."""
        if not isinstance(values, dict) or "alpha" not in values:
            return values
        if "zeta" in values:
            raise ValueError("give the concentration as zeta or as its synonym alpha, not both")
        return {("zeta" if key == "alpha" else key): value for key, value in values.items()}


class ShardParams(Params):
    classes_per_client: int = Field(2, ge=1)


def labels_of(samples: TaskSamples, kind: str) -> np.ndarray:
    """The task's class labels, which partitioner `kind` needs: none on a regression task is one sentence."""
    if samples.labels is None:
        raise ManytaskError(
            f"sample partitioner '{kind}' needs class labels, but task '{samples.task}' is a regression task."
        )
    return samples.labels


@SAMPLE_PARTITIONERS.register("iid", Params, "uniformly random split, sizes proportional to holder shares")
def _iid(samples: TaskSamples, params: Params, rng: np.random.Generator) -> list[np.ndarray]:
    return iid_partition(samples.num_samples, samples.shares, rng)


@SAMPLE_PARTITIONERS.register("dirichlet", DirichletParams, "label skew: class proportions ~ Dirichlet(zeta)")
def _dirichlet(samples: TaskSamples, params: DirichletParams, rng: np.random.Generator) -> list[np.ndarray]:
    labels = labels_of(samples, "dirichlet")
    return dirichlet_label_partition(labels, samples.shares, params.zeta, rng, params.min_size)


@SAMPLE_PARTITIONERS.register(
    "label-skew", DirichletParams, "dirichlet on tasks with class labels, iid on tasks without (any benchmark)"
)
def _label_skew(samples: TaskSamples, params: DirichletParams, rng: np.random.Generator) -> list[np.ndarray]:
    # Regression and dense tasks have no label to skew; a default must still work on every benchmark.
    if samples.labels is None:
        return _iid(samples, params, rng)
    return _dirichlet(samples, params, rng)


@SAMPLE_PARTITIONERS.register("shards", ShardParams, "label shards: ≤ classes_per_client classes per holder")
def _shards(samples: TaskSamples, params: ShardParams, rng: np.random.Generator) -> list[np.ndarray]:
    labels = labels_of(samples, "shards")
    return label_shard_partition(labels, len(samples.shares), params.classes_per_client, rng)


@SAMPLE_PARTITIONERS.register("natural", Params, "one holder per natural group of samples (e.g. a building), in order")
def _natural(samples: TaskSamples, params: Params, rng: np.random.Generator) -> list[np.ndarray]:
    if samples.groups is None:
        raise ManytaskError(
            f"the benchmark of task '{samples.task}' has no natural client split; use samples: {{kind: iid}} "
            "or another sample partitioner."
        )
    parts = natural_partition(samples.groups)
    if len(parts) != len(samples.shares):
        raise ManytaskError(
            f"task '{samples.task}' has {len(parts)} natural clients (sample groups such as buildings) but "
            f"{len(samples.shares)} holders; set federation.num_clients: {len(parts)} with tasks: {{kind: all}}."
        )
    return parts
