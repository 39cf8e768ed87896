"""Wire names and the scalars every method uploads: each held task's sample count `n/<task>` and mean training loss
`loss/<task>`. Servers read task sizes from replies through `task_sizes` and log the round's training losses with
`mean_train_losses`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from manytask.client.trainer import TaskData
from manytask.errors import clipped
from manytask.messages import Message
from manytask.metric_names import train_loss_key

SIZE_PREFIX = "n/"
LOSS_PREFIX = "loss/"


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
