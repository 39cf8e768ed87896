"""`label-skew`: one personal task per client, each client holding a few classes of one source dataset
(SFMTL-Graph's heterogeneous CIFAR-10, on any source of `personal.py`).

Classes: a seeded permutation of the classes is read in a cycle, client i taking the k = `classes_per_client`
classes at positions i·k … i·k + k − 1 (mod C). They are distinct and every class is used by ⌊N·k/C⌋ or
⌈N·k/C⌉ clients. Proportions: each of a client's classes draws a weight from U(0.4, 0.6), normalized over the
client (for k = 2 each share lies in [0.4, 0.6]).

Sizes: all clients get the same number m of training images (the most the scarcest class allows, capped by
`samples_per_client`), m·share of each of their classes rounded down, drawn without replacement from that class's
pool, so clients' training sets are disjoint. The local test sets are drawn the same way, with the same shares,
from the source's test set. Every task keeps the source's full label space (10 outputs), so heads and anchors
have one shape on all clients. Metadata: `groups` (clients with the same class set share a group id),
`classes` and `proportions` per task.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field
from torch import Tensor

from manytask.benchmarks.base import Benchmark
from manytask.benchmarks.mnist1d import Mnist1dParams
from manytask.benchmarks.personal import Source, SourceParams, load_source, personal_benchmark, personal_task
from manytask.benchmarks.registry import register_benchmark
from manytask.errors import ManytaskError
from manytask.seeding import numpy_rng

SHARE_RANGE = (0.4, 0.6)


class LabelSkewParams(SourceParams):
    source: Literal["digits", "mnist1d", "cifar10", "mnist", "fashion-mnist"] = Field(
        "digits", description="the dataset to split"
    )
    num_clients: int = Field(30, ge=1)
    classes_per_client: int = Field(2, ge=1)
    samples_per_client: int | None = Field(None, ge=1, description="cap on each client's training images")
    num_samples: int = Field(Mnist1dParams().num_samples, ge=100, description="mnist1d source: signals generated")


def assign_classes(num_clients: int, num_classes: int, per_client: int, rng: np.random.Generator) -> np.ndarray:
    """(clients, per_client) sorted class ids: consecutive positions of a seeded class permutation, cycled."""
    order = rng.permutation(num_classes)
    positions = np.arange(num_clients)[:, None] * per_client + np.arange(per_client)
    return np.sort(order[positions % num_classes], axis=1)


def draw_shares(num_clients: int, per_client: int, rng: np.random.Generator) -> np.ndarray:
    """(clients, per_client) class proportions: U(0.4, 0.6) weights normalized per client."""
    weights = rng.uniform(*SHARE_RANGE, size=(num_clients, per_client))
    return weights / weights.sum(axis=1, keepdims=True)


def client_counts(labels: np.ndarray, classes: np.ndarray, shares: np.ndarray, cap: int | None,
                  split: str) -> np.ndarray:
    """(clients, per_client) image counts ⌊m·share⌋ for the largest common size m the labels allow (≤ cap)."""
    num_classes = max(int(labels.max(initial=0)), int(classes.max())) + 1
    demand = np.bincount(classes.ravel(), weights=shares.ravel(), minlength=num_classes)
    available = np.bincount(labels, minlength=num_classes)
    used = demand > 0
    size = int(np.floor((available[used] / demand[used]).min()))  # the scarcest class limits everyone
    counts = np.floor(min(size, cap if cap is not None else size) * shares).astype(np.int64)
    if counts.min() == 0:
        raise ManytaskError(
            f"benchmark 'label-skew' leaves client {int(counts.min(axis=1).argmin())} without {split} images of one "
            "of its classes; use fewer clients or more data."
        )
    return counts


def draw_indices(labels: Tensor, classes: np.ndarray, shares: np.ndarray, cap: int | None, split: str,
                 rng: np.random.Generator) -> list[np.ndarray]:
    """Per client, indices into `labels` drawn without replacement (so disjoint across clients), by `client_counts`."""
    labels_np = labels.numpy()
    counts = client_counts(labels_np, classes, shares, cap, split)
    pools = {c: rng.permutation(np.flatnonzero(labels_np == c)) for c in np.unique(classes).tolist()}
    taken = dict.fromkeys(pools, 0)
    out = []
    for client_classes, client_sizes in zip(classes.tolist(), counts.tolist(), strict=True):
        parts = []
        for c, n in zip(client_classes, client_sizes, strict=True):
            parts.append(pools[c][taken[c]:taken[c] + n])
            taken[c] += n
        out.append(np.sort(np.concatenate(parts)))
    return out


def class_set_groups(classes: np.ndarray) -> list[int]:
    """A group id per client: clients holding the same class set share it, numbered by first appearance."""
    ids: dict[tuple[int, ...], int] = {}
    return [ids.setdefault(tuple(row), len(ids)) for row in classes.tolist()]


def _client_parts(
    source: Source, params: LabelSkewParams, seed: int
) -> tuple[np.ndarray, np.ndarray, list[np.ndarray], list[np.ndarray]]:
    """Each client's classes, their shares, and its training and test indices into the source."""
    k = params.classes_per_client
    if k > source.num_classes:
        raise ManytaskError(f"classes_per_client must be at most {source.num_classes}, got {k}.")
    classes = assign_classes(params.num_clients, source.num_classes, k, numpy_rng(seed, "label-skew", "classes"))
    shares = draw_shares(params.num_clients, k, numpy_rng(seed, "label-skew", "shares"))
    train = draw_indices(source.y_train, classes, shares, params.samples_per_client, "training",
                         numpy_rng(seed, "label-skew", "train-pools"))
    test = draw_indices(source.y_test, classes, shares, None, "test", numpy_rng(seed, "label-skew", "test-pools"))
    return classes, shares, train, test


@register_benchmark(
    "label-skew", LabelSkewParams, "one task per client: a few classes of one dataset each, in U(0.4, 0.6) shares"
)
def label_skew(params: LabelSkewParams, seed: int) -> Benchmark:
    """N personal tasks over disjoint label-skewed slices of the source's train and test sets."""
    source = load_source(params.source, params, seed, "label-skew", params.num_samples)
    classes, shares, train, test = _client_parts(source, params, seed)
    tasks = []
    for client in range(params.num_clients):
        tr, te = train[client], test[client]
        arrays = (source.x_train[tr], source.y_train[tr], source.x_test[te], source.y_test[te])
        held = ", ".join(f"{c} ({s:.0%})" for c, s in zip(classes[client], shares[client], strict=True))
        tasks.append(personal_task(client, arrays, source.num_classes, f"client {client}: classes {held}"))
    names = [task.name for task in tasks]
    metadata = {
        "classes": dict(zip(names, classes.tolist(), strict=True)),
        "proportions": dict(zip(names, shares.round(4).tolist(), strict=True)),
    }
    description = (f"{params.num_clients} personal tasks on {source.label}, {params.classes_per_client} classes "
                   "each in U(0.4, 0.6) proportions, disjoint train and local test sets")
    return personal_benchmark("label-skew", tasks, class_set_groups(classes), description, metadata)
