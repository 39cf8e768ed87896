"""Aggregation math shared by the hosts and the many-task methods: FedAvg's per-parameter weights and the weighted
average over the updates that contain a parameter."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

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


# bytes of values stacked at once (`_ordered_sum`, the divergence guard): under the 32 MiB a run serves from the
# heap (`engine/heap.py`), so a block reuses freed memory instead of mapping fresh pages every round (64 MiB
# blocks made the aggregation of a 20-client round of the SFMTL CNN twice as slow, for the same bits)
SUM_BLOCK_BYTES = 1 << 24
# entries per column chunk of a stacked sum: 20 clients' float64 terms of one chunk (2.6 MB) stay in the cache
# between the stack, the scaling and the sum, which made the float64 average of the SFMTL CNN's 20-client round
# 2.5× faster than whole rows; the op count grows with a key's size, never with the number of clients
SUM_COLUMNS = 1 << 14


def _ordered_sum(values: list[Tensor], scales: list[Weight]) -> Tensor:
    """Σ_n w_n · float64(v_n), added one term after the other in the order given. On the CPU, values of one shape
    and dtype with float weights are stacked (in chunks of `SUM_COLUMNS` entries and blocks of at most
    `SUM_BLOCK_BYTES`), scaled, and added into the first term by `index_add_`, whose CPU kernel adds the rows one
    after the other: the same bits as a loop of adds, in a few ops per chunk instead of a few per update."""
    first = values[0]
    if first.device.type == "cpu" and all(type(w) is float for w in scales) and all(
            v.shape == first.shape and v.dtype == first.dtype for v in values):
        return _stacked_sum(values, scales)  # type: ignore[arg-type]
    total = _weighted(first, scales[0])
    for value, w in zip(values[1:], scales[1:], strict=True):
        total = total + _weighted(value, w)
    return total


def row_blocks(count: int, row_bytes: int) -> list[slice]:
    """Consecutive blocks of `count` rows of `row_bytes` each, at most `SUM_BLOCK_BYTES` a block (two rows at
    least)."""
    rows = max(2, SUM_BLOCK_BYTES // max(row_bytes, 1))
    return [slice(start, start + rows) for start in range(0, count, rows)]


def stacked_chunks(flats: list[Tensor], dtype: torch.dtype | None = None) -> Iterator[tuple[slice, slice, Tensor]]:
    """(columns, rows, the rows' flat values at those columns stacked, in `dtype` if given) over column chunks of
    `SUM_COLUMNS` entries and, within each, row blocks of at most `SUM_BLOCK_BYTES` (`row_blocks`)."""
    size = flats[0].numel()
    element = torch.empty((), dtype=dtype or flats[0].dtype).element_size()
    for start in range(0, size, SUM_COLUMNS):
        columns = slice(start, min(start + SUM_COLUMNS, size))
        width = columns.stop - start
        for rows in row_blocks(len(flats), element * width):
            pieces = [f[columns] for f in flats[rows]]
            out = None if dtype is None else torch.empty((len(pieces), width), dtype=dtype)  # cast on copy
            yield columns, rows, torch.stack(pieces, out=out)


def _stacked_sum(values: list[Tensor], scales: list[float]) -> Tensor:
    out = torch.empty(values[0].numel(), dtype=torch.float64)
    weights = torch.tensor(scales, dtype=torch.float64).view(-1, 1)
    for columns, rows, terms in stacked_chunks([v.reshape(-1) for v in values], torch.float64):
        terms.mul_(weights[rows])
        total = out[columns]
        if rows.start == 0:
            total.copy_(terms[0])
            terms = terms[1:]
        total.unsqueeze(0).index_add_(0, torch.zeros(len(terms), dtype=torch.long), terms)
    return out.view(values[0].shape)


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
