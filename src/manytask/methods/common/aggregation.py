"""Aggregation math shared by the hosts and the many-task methods: FedAvg's per-parameter weights and the weighted
average over the updates that contain a parameter."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
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
    columns: dict[str, tuple[list[Tensor], list[Weight]]] = {}  # per key, its values and weights in update order
    for update, weight in zip(updates, weights, strict=True):
        for key, value in update.items():
            values, scales = columns.setdefault(key, ([], []))
            values.append(value)
            scales.append(weight[key])
    averages = {}
    for key, (values, scales) in columns.items():
        total: Weight = 0.0
        for w in scales:
            total = total + w
        if _positive(key, total):
            averages[key] = (_ordered_sum(values, scales) / total).to(values[-1].dtype)
    return averages


# entries per column chunk of a sum or of the divergence guard's distances: a chunk's terms stay in the cache
# between their conversion, scaling and addition
SUM_COLUMNS = 1 << 14
# dtypes whose CPU tensors numpy views without a copy (bfloat16 and complex values take the loop of torch adds)
NUMPY_DTYPES = frozenset({torch.float64, torch.float32, torch.float16, torch.int64, torch.int32, torch.int16,
                           torch.int8, torch.uint8, torch.bool})


def _ordered_sum(values: list[Tensor], scales: list[Weight]) -> Tensor:
    """Σ_n w_n · float64(v_n), added one term after the other in the order given. On the CPU, values of one shape
    and a numpy dtype with float weights are summed by numpy in column chunks (`_chunked_sum`)."""
    first = values[0]
    if first.device.type == "cpu" and first.dtype in NUMPY_DTYPES and all(type(w) is float for w in scales) and all(
            v.shape == first.shape and v.dtype == first.dtype for v in values):
        return _chunked_sum(values, scales)  # type: ignore[arg-type]
    total = _weighted(first, scales[0])
    for value, w in zip(values[1:], scales[1:], strict=True):
        total = total + _weighted(value, w)
    return total


def _chunked_sum(values: list[Tensor], scales: list[float]) -> Tensor:
    """The ordered float64 sum with numpy's ufuncs over column chunks of `SUM_COLUMNS` entries: per chunk, the first
    term is converted and scaled into the result, each later one into a float64 buffer (one ufunc converts and
    scales) and added to it. Each term is rounded once and added in order, so the bits are a loop of adds'; a chunk
    stays in the cache, and a ufunc call costs about a microsecond: half the time of the stacked torch sum this
    replaced (chunks stacked, scaled and `index_add_`-ed) on the SFMTL CNN's 20-client round."""
    flats = [value.detach().reshape(-1).numpy() for value in values]
    out = np.empty(flats[0].size, np.float64)
    term = np.empty(min(out.size, SUM_COLUMNS), np.float64)
    for start in range(0, out.size, SUM_COLUMNS):
        columns = slice(start, start + SUM_COLUMNS)
        total = out[columns]
        buffer = term[:total.size]
        np.multiply(flats[0][columns], scales[0], out=total, dtype=np.float64)
        for flat, scale in zip(flats[1:], scales[1:], strict=True):
            np.multiply(flat[columns], scale, out=buffer, dtype=np.float64)
            np.add(total, buffer, out=total)
    return torch.from_numpy(out).view(values[0].shape)


def scaled_step(before: Mapping[str, Tensor], after: Mapping[str, Tensor], eta: float) -> dict[str, Tensor]:
    """The server step control θ ← θ + η_s (θ' − θ) for every key of `after` (θ', the rule's result) that `before`
    (θ) holds; η_s = 1 returns θ' itself, bit for bit."""
    if eta == 1:
        return dict(after)
    return {k: v if before.get(k) is None else before[k] + eta * (v - before[k]) for k, v in after.items()}


def _weighted(value: Tensor, weight: Weight) -> Tensor:
    """`weight * value.double()` (a tensor weight may broadcast to a larger shape)."""
    return weight * value.double()


def _positive(key: str, total: Weight) -> bool:
    if not isinstance(total, Tensor) or total.dim() == 0:
        return bool(total > 0)
    positive = total > 0
    if bool(positive.any()) and not bool(positive.all()):
        raise ValueError(f"per-entry weights of '{key}' sum to zero at some entries")
    return bool(positive.all())
