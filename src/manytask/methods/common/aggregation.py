"""Aggregation math shared by the hosts and the many-task methods: FedAvg's per-parameter weights and the weighted
average over the updates that contain a parameter."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from manytask.models.multitask import task_of_key

Weight = float | Tensor  # a scalar per parameter, or a tensor that broadcasts against it (one weight per entry)


def fedavg_weights(keys: Sequence[str], task_sizes: Mapping[str, int]) -> dict[str, float]:
    """A client's aggregation weight per parameter (McMahan et al., 2017, with task heads): its task's size
    |D_n^t| for a head of task t, its total size Σ_t |D_n^t| otherwise."""
    total = float(sum(task_sizes.values()))
    return {k: float(task_sizes[t]) if (t := task_of_key(k)) is not None else total for k in keys}


def weighted_average(
    updates: Sequence[Mapping[str, Tensor]], weights: Sequence[Mapping[str, Weight]]
) -> dict[str, Tensor]:
    """θ_k = Σ_n w_{n,k} θ_{n,k} / Σ_n w_{n,k} for every key k, over the updates that contain k (so weights are
    renormalized per key, and per entry when a weight is a tensor). Sums run in float64, in the order given:
    callers pass updates sorted by client id for reproducible sums. A key whose weights sum to zero (at every
    entry) is left out; per-entry weights that sum to zero at only some entries are an error."""
    sums: dict[str, Tensor] = {}
    totals: dict[str, Weight] = {}
    dtypes: dict[str, torch.dtype] = {}
    for update, weight in zip(updates, weights, strict=True):
        into: list[Tensor] = []  # the sums that take `_weighted(value, w)` in place, batched below: the values,
        values: list[Tensor] = []  # the weights
        scales: list[float] = []
        for key, value in update.items():
            w = weight[key]
            total = sums.get(key)
            if _scaled(value, w) and total is not None and total.shape == value.shape:
                into.append(total)
                values.append(value)
                scales.append(w)
            else:
                term = _weighted(value, w)
                sums[key] = term if total is None else total + term
            totals[key] = totals.get(key, 0.0) + w
            dtypes[key] = value.dtype
        if into:  # `total.add_(_weighted(value, w))` for every one of them, in three ops over the lists
            terms = [value.double() for value in values]
            torch._foreach_mul_(terms, scales)
            torch._foreach_add_(into, terms)
    return {k: (sums[k] / totals[k]).to(dtypes[k]) for k in sums if _positive(k, totals[k])}


def _scaled(value: Tensor, weight: Weight) -> bool:
    """True where `_weighted` scales a float64 copy of `value` by a float: the common case, batched above."""
    return type(weight) is float and value.dtype != torch.float64


def _weighted(value: Tensor, weight: Weight) -> Tensor:
    """`weight * value.double()`, scaled in place when the conversion made a copy (one tensor fewer per term:
    the same products). A float64 value is not copied, and a tensor weight may broadcast to a larger shape."""
    double = value.double()
    return double.mul_(weight) if type(weight) is float and double is not value else weight * double


def _positive(key: str, total: Weight) -> bool:
    if not isinstance(total, Tensor) or total.dim() == 0:
        return bool(total > 0)
    positive = total > 0
    if bool(positive.any()) and not bool(positive.all()):
        raise ValueError(f"per-entry weights of '{key}' sum to zero at some entries")
    return bool(positive.all())
