"""Wire names and the scalars every method uploads: each held task's sample count `n/<task>` and mean training loss
`loss/<task>`. Servers read task sizes from replies through `task_sizes` and log the round's training losses with
`mean_train_losses`; they declare the arrays a reply must hold through `arrays_problem` (screening)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from manytask.client.trainer import TaskData
from manytask.errors import clipped
from manytask.messages import Message
from manytask.metric_names import train_loss_key

SIZE_PREFIX = "n/"
LOSS_PREFIX = "loss/"
ArraySpec = tuple[tuple[int, ...], torch.dtype]  # (shape, dtype) an uploaded array must have


def fit_scalars(data: TaskData, losses: Mapping[str, float]) -> dict[str, float]:
    """The scalars a client reports after training: its sample count and mean training loss per task."""
    scalars: dict[str, float] = {SIZE_PREFIX + task: len(y) for task, (_, y) in data.items()}
    scalars.update({LOSS_PREFIX + task: loss for task, loss in losses.items()})
    return scalars


def task_sizes(reply: Message) -> dict[str, int]:
    """|D_n^t| per task a reply reports."""
    return {k[len(SIZE_PREFIX) :]: int(v) for k, v in reply.scalars.items() if k.startswith(SIZE_PREFIX)}


def counts_problem(client: int, reply: Message, held: Sequence[str]) -> str | None:
    """Why `reply` does not report the sample count of exactly the tasks its client holds, or None."""
    reported = sorted(task_sizes(reply))
    if reported != sorted(held):
        return f"reply reports sample counts of tasks {clipped(reported)}, where client {client} holds {sorted(held)}"
    return None


def array_specs(tensors: Mapping[str, Tensor]) -> dict[str, ArraySpec]:
    """name -> (shape, dtype) of each tensor as the wire carries it (a 0-d tensor travels as shape (1,), as numpy's
    `ascontiguousarray` makes it): what replies mirroring these tensors must match."""
    return {k: (tuple(v.shape) or (1,), v.dtype) for k, v in tensors.items()}


def spec_problem(name: str, array: Tensor, spec: ArraySpec, expected: str = "is expected") -> str | None:
    """Why `array` does not have the shape and dtype of `spec` (one sentence), or None."""
    if tuple(array.shape) == spec[0] and array.dtype == spec[1]:
        return None
    return f"reply's '{clipped(name)}' is {array.dtype} {tuple(array.shape)}, where {spec[1]} {spec[0]} {expected}"


def arrays_problem(reply: Message, expected: Mapping[str, ArraySpec]) -> str | None:
    """Why the reply's arrays are not exactly `expected` (every name there, none other, each of its shape and
    dtype), or None."""
    for name, array in reply.tensors().items():
        spec = expected.get(name)
        if spec is None:
            return f"reply carries '{clipped(name)}', which this method's clients do not upload"
        if problem := spec_problem(name, array, spec):
            return problem
    missing = [name for name in expected if name not in reply.arrays]
    return f"reply lacks '{clipped(missing[0])}'" if missing else None


def mean_train_losses(replies: Sequence[Message]) -> dict[str, float]:
    """Sample-weighted mean of the clients' reported training losses, per task."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for reply in replies:
        sizes = task_sizes(reply)
        for key, loss in reply.scalars.items():
            if key.startswith(LOSS_PREFIX):
                task = key[len(LOSS_PREFIX) :]
                sums[task] = sums.get(task, 0.0) + float(loss) * sizes[task]
                counts[task] = counts.get(task, 0) + sizes[task]
    return {train_loss_key(t): sums[t] / counts[t] for t in sorted(sums) if counts[t]}
