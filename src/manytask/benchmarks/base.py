"""`Benchmark`: a named, ordered set of tasks whose inputs share one shape, plus metadata."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch
from torch import Tensor

from manytask.benchmarks.rows import materialize
from manytask.errors import ManytaskError, unknown_choice
from manytask.tasks.task import Task, TaskSpec, classification_task


@dataclass
class Benchmark:
    name: str
    tasks: dict[str, Task]
    description: str = ""
    metadata: dict = field(default_factory=dict)
    pretraining: Task | None = None  # source data no task uses, for pretraining a backbone (model.pretrained)

    def __post_init__(self) -> None:
        if not self.tasks:
            raise ValueError(f"benchmark '{self.name}' has no tasks")
        shapes = {t.input_shape for t in [*self.tasks.values(), *([self.pretraining] if self.pretraining else [])]}
        if len(shapes) != 1:
            raise ValueError(f"benchmark '{self.name}': tasks must share one input shape, got {sorted(shapes)}")

    @property
    def input_shape(self) -> tuple[int, ...]:
        return next(iter(self.tasks.values())).input_shape

    @property
    def task_names(self) -> list[str]:
        return list(self.tasks)

    @property
    def specs(self) -> dict[str, TaskSpec]:
        return {name: task.spec for name, task in self.tasks.items()}

    def with_losses(self, losses: Mapping[str, str]) -> Benchmark:
        """This benchmark with the named tasks trained on an alternative loss (`train.losses`: task -> loss name);
        raises ManytaskError for a task it does not have or a loss that does not fit a task's kind."""
        if not losses:
            return self
        tasks = dict(self.tasks)
        for name, loss in losses.items():
            if name not in tasks:
                raise unknown_choice(f"task in train.losses for benchmark '{self.name}'", name, self.task_names)
            try:
                tasks[name] = replace(tasks[name], spec=replace(tasks[name].spec, loss_choice=loss))
            except ValueError as err:
                raise ManytaskError(f"train.losses: {err}") from err
        return replace(self, tasks=tasks)

    @classmethod
    def from_tensors(
        cls,
        name: str,
        tasks: Mapping[str, tuple[Tensor, Tensor, Tensor, Tensor]],
        description: str = "",
        metadata: dict | None = None,
    ) -> Benchmark:
        """Classification tasks from `{task: (x_train, y_train, x_test, y_test)}` tensors (or numpy arrays)."""
        built = {
            task: classification_task(task, *(torch.as_tensor(np.asarray(a)) for a in arrays))
            for task, arrays in tasks.items()
        }
        return cls(name, built, description, metadata or {})

    @classmethod
    def from_datasets(
        cls, name: str, tasks: Mapping[str, tuple[Any, Any]], description: str = "",
        input_key: str | None = None, label_key: str | Mapping[str, str] | None = None,
    ) -> Benchmark:
        """Classification tasks from `{task: (train_rows, test_rows)}`: torch Datasets, lists or Hugging Face
        Datasets whose rows are (input, label) pairs or mappings with named fields, found among the usual names or
        named by `input_key` / `label_key` (which may map each task to its own label field). Inputs may be tensors,
        arrays, lists of numbers or PIL images (`benchmarks/rows.py` says how each is converted); anything else is
        refused in one sentence.

        The rows are materialized into tensors once, so they should fit in memory."""
        arrays = {}
        for task, (train, test) in tasks.items():
            label = label_key.get(task) if isinstance(label_key, Mapping) else label_key
            arrays[task] = (*materialize(train, f"task '{task}', train split", input_key, label),
                            *materialize(test, f"task '{task}', test split", input_key, label))
        return cls.from_tensors(name, arrays, description)


def record_natural_groups(tasks: Iterable[Task], ids: Sequence[Any]) -> list[Any]:
    """Store each training sample's natural client (a writer, a speaker: `ids`, one per row) as every task's
    `sample_groups`, the numbers 0..G−1 in the sorted order of the distinct ids, which is what
    `samples: {kind: natural}` splits by (holder k gets the k-th id); returns the distinct ids in that order."""
    distinct, groups = np.unique(np.asarray(ids), return_inverse=True)
    for task in tasks:
        if task.num_train != len(groups):
            raise ValueError(f"task '{task.name}' has {task.num_train} training samples but {len(groups)} group ids")
        task.metadata["sample_groups"] = groups.astype(np.int64)
    return distinct.tolist()


def check_named_tasks(benchmark: str, names: Sequence[str], valid: Sequence[str], kind: str) -> None:
    """A task list of a benchmark with named tasks: not empty, every name one of `valid` (an unknown one is a
    `kind` choice: 'digits task'), none twice; each problem one sentence."""
    if not names:
        raise ManytaskError(f"benchmark '{benchmark}' needs at least one task; valid tasks: {', '.join(valid)}.")
    for name in names:
        if name not in valid:
            raise unknown_choice(kind, name, list(valid))
    if len(set(names)) != len(names):
        raise ManytaskError(f"benchmark '{benchmark}' lists a task twice; give each task at most once.")
