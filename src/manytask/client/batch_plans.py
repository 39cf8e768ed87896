"""How vectorized clients' batches are planned: each client's batches of each task at each step, drawn from the
same seeded streams `Trainer.train` draws, padded to the batch size with per-sample weights that make each row's
loss its own batch mean. `TaskPlan` also runs a task's forward pass for any model (`functional_call` under `vmap`);
plain chains run theirs in `client/plain_chain.py`."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import cached_property
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap

from manytask.client.trainer import Trainer, index_batches, shares_inputs, stream_seed_request
from manytask.models.multitask import task_of_key
from manytask.seeding import derive_seeds
from manytask.tasks.task import TaskKind, TaskSpec

if TYPE_CHECKING:
    from manytask.client.vectorized import ClientJob

def _cross_entropy(outputs: Tensor, targets: Tensor) -> Tensor:
    return nn.functional.cross_entropy(outputs, targets, reduction="none")


def _squared_error(outputs: Tensor, targets: Tensor) -> Tensor:
    return (outputs - targets.view_as(outputs)).pow(2).flatten(1).mean(1)


# per-sample losses whose batch mean is `TaskSpec.loss`
SAMPLE_LOSSES: dict[TaskKind, Callable[[Tensor, Tensor], Tensor]] = {
    TaskKind.CLASSIFICATION: _cross_entropy, TaskKind.REGRESSION: _squared_error,
}


def padded_batches(batches: list[Tensor], batch: int, like: Tensor) -> tuple[Tensor, Tensor]:
    """Index batches padded to `batch`, (rows, batch), and their per-sample weights: 1/n on a row's n real samples,
    0 on padding (in `like`'s floating dtype, on its device)."""
    dtype = like.dtype if like.is_floating_point() else torch.get_default_dtype()
    if not batches:
        return (torch.zeros(0, batch, dtype=torch.long, device=like.device),
                torch.zeros(0, batch, dtype=dtype, device=like.device))
    counts = torch.tensor([b.shape[0] for b in batches])[:, None]
    real = torch.arange(batch) < counts
    # one scatter of all batches in row order: pad_sequence copies them one by one
    index = torch.zeros(real.shape, dtype=batches[0].dtype).masked_scatter_(real, torch.cat(batches))
    weight = real.to(dtype) / counts.to(dtype)
    return index.to(like.device), weight.to(like.device)


StepLosses = list[tuple[Tensor, Tensor, Tensor]]  # (task columns, client rows, losses), aligned
Placed = tuple[int, Tensor, int]  # (client, a batch of its own sample indices, where its samples start)


def offsets(starts: list[int], index: Tensor) -> Tensor:
    """Per-row starts as a column to add to padded indices, (rows, 1): padding then points at the row's first
    sample, a real one whose weight is 0."""
    return torch.tensor(starts, dtype=index.dtype, device=index.device)[:, None]


class TaskPlan:
    """One task's batches: per step, the clients that take a batch of this task (they hold it and have steps left),
    their indices into the task's data of all clients concatenated, (rows, batch), and per-sample weights (1/n on a
    client's n real samples, 0 on padding). Only those clients run the task's forward pass, so the batched work is
    the sequential work plus padding."""

    def __init__(self, task: str, spec: TaskSpec, xs: list[Tensor], y: Tensor, steps: int, batch: int) -> None:
        self.task, self.xs, self.y, self.batch = task, xs, y, batch
        self.outputs, self.kind = spec.num_outputs, spec.kind
        self.sample_loss = SAMPLE_LOSSES[spec.kind]
        self.placed: list[list[Placed]] = [[] for _ in range(steps)]  # step -> [(client, indices, offset)]

    @cached_property
    def x(self) -> Tensor:
        """The inputs of every holder, concatenated (plain chains concatenate every task's `xs` at once instead)."""
        return torch.cat(self.xs)

    def place(self, step: int, client: int, chosen: Tensor, offset: int) -> None:
        """A batch of the client's own sample indices; `offset` is where its samples start in `x`."""
        self.placed[step].append((client, chosen, offset))

    def finish(self) -> None:
        """Stack each step's placed batches into rows, (rows,), indices and weights, (rows, batch)."""
        self.steps = [self._stacked(placed) for placed in self.placed]

    def _stacked(self, placed: list[Placed]) -> tuple[Tensor, Tensor, Tensor]:
        rows = torch.tensor([client for client, _, _ in placed], dtype=torch.long, device=self.y.device)
        index, weight = padded_batches([chosen for _, chosen, _ in placed], self.batch, self.xs[0])
        return rows, index + offsets([offset for _, _, offset in placed], index), weight

    def live(self, step: int) -> bool:
        return len(self.steps[step][0]) > 0

    def losses(self, template: nn.Module, params: Mapping[str, Tensor], step: int) -> tuple[Tensor, Tensor]:
        """(the clients that take a batch of this task at `step`, each one's mean loss on it), the forward pass
        through `functional_call` under `vmap`."""
        rows, index, _ = self.steps[step]
        used = {k: p.index_select(0, rows) for k, p in params.items() if task_of_key(k) in (None, self.task)}

        def one(client_params: dict[str, Tensor], client_x: Tensor) -> Tensor:
            return functional_call(template, client_params, (client_x, self.task), strict=False)

        return rows, self.mean_losses(vmap(one)(used, self.x[index]), step)

    def mean_losses(self, outputs: Tensor, step: int) -> Tensor:
        """Each row's weighted mean loss at `step` from its outputs, (rows, batch, ...)."""
        _, index, weight = self.steps[step]
        per_sample = self.sample_loss(outputs.flatten(0, 1), self.y[index].flatten(0, 1)).view(index.shape)
        return (per_sample * weight).sum(dim=1)


def batch_plans(trainer: Trainer, jobs: Sequence[ClientJob], steps: list[int]) -> dict[str, TaskPlan]:
    """Each task's plan, filled from the same seeded streams `Trainer.train` draws (one shared stream of indices
    when a client's tasks label the same inputs)."""
    batch = trainer.config.batch_size
    tasks = [t for t in trainer.specs if any(t in job.data for job in jobs)]  # the setup's order, as the passes'
    offsets: list[dict[str, int]] = [{} for _ in jobs]
    plans = {}
    for task in tasks:
        holders = [c for c, job in enumerate(jobs) if task in job.data]
        sizes = [jobs[c].data[task][1].shape[0] for c in holders]
        for c, start in zip(holders, torch.tensor([0, *sizes[:-1]]).cumsum(0).tolist(), strict=True):
            offsets[c][task] = start
        y = torch.cat([jobs[c].data[task][1] for c in holders])
        plans[task] = TaskPlan(task, trainer.specs[task], [jobs[c].data[task][0] for c in holders], y, max(steps),
                               batch)
    shared = [shares_inputs(job.data) for job in jobs]
    keys = [["shared"] if one else list(job.data) for job, one in zip(jobs, shared, strict=True)]
    seeds = iter(derive_seeds([stream_seed_request(job.seed, k) for job, ks in zip(jobs, keys, strict=True)
                               for k in ks]))
    for c, (job, own) in enumerate(zip(jobs, steps, strict=True)):
        if shared[c]:
            stream = _stream(next(iter(job.data.values()))[1].shape[0], batch, next(seeds))
            for step in range(own):
                chosen = next(stream)
                for task in job.data:
                    plans[task].place(step, c, chosen, offsets[c][task])
        else:
            streams = {t: _stream(y.shape[0], batch, next(seeds)) for t, (_, y) in job.data.items()}
            for step in range(own):
                for task, stream in streams.items():
                    plans[task].place(step, c, next(stream), offsets[c][task])
    return plans


def _stream(count: int, batch: int, seed: int) -> Iterator[Tensor]:
    """`shuffled_indices` of a stream whose seed is derived already (`stream_seed_request`)."""
    return index_batches(count, batch, torch.Generator().manual_seed(seed))
