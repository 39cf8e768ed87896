"""Build a `Federation` from a benchmark: allocate tasks to clients, then partition each task's samples."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from manytask.benchmarks.base import Benchmark
from manytask.errors import ManytaskError
from manytask.federation import flower_partitioners  # noqa: F401  (registers samples: {kind: flwr})
from manytask.federation.allocation import TASK_ALLOCATIONS, Allocation
from manytask.federation.federation import Federation
from manytask.federation.partition import SAMPLE_PARTITIONERS, TaskSamples
from manytask.registry import Params, Registry
from manytask.seeding import numpy_rng
from manytask.tasks.task import Task

FEDERATION_CHOICES: dict[str, Registry] = {"tasks": TASK_ALLOCATIONS, "samples": SAMPLE_PARTITIONERS}
DEFAULT_KINDS = {"tasks": "one-per-client", "samples": "iid"}


def parse_choice(section: str, spec: Mapping[str, Any] | None) -> tuple[str, Params]:
    """Split `{"kind": name, **params}` of federation section `section` and validate the params."""
    if spec is None:
        spec = {}
    if not isinstance(spec, Mapping):
        raise ManytaskError(f"federation '{section}' must be a mapping with a 'kind' key; got {spec!r}.")
    values = dict(spec)
    kind = values.pop("kind", DEFAULT_KINDS[section])
    return kind, FEDERATION_CHOICES[section].parse_params(kind, values)


def build_federation(
    benchmark: Benchmark,
    num_clients: int,
    tasks: Mapping[str, Any] | None = None,
    samples: Mapping[str, Any] | None = None,
    seed: int = 0,
    same_samples: bool = False,
) -> Federation:
    """Allocate the benchmark's tasks to `num_clients` clients and split each task's training samples among
    its holders; deterministic in `seed`. With `same_samples`, the first task's split is every task's, so a client's
    tasks label the same inputs at every step (the benchmark's tasks must share their inputs and their holders)."""
    if isinstance(num_clients, bool) or not isinstance(num_clients, (int, np.integer)) or num_clients < 1:
        raise ManytaskError(f"the number of clients must be an integer ≥ 1, got {num_clients!r}.")
    num_clients = int(num_clients)
    task_kind, task_params = parse_choice("tasks", tasks)
    sample_kind, sample_params = parse_choice("samples", samples)
    allocate = TASK_ALLOCATIONS.get(task_kind).target
    task_rng = numpy_rng(seed, "federation", "tasks")
    allocation = allocate(benchmark.task_names, num_clients, task_params, task_rng)
    clients: list[dict[str, np.ndarray]] = [{} for _ in range(num_clients)]
    same_samples = same_samples and _several_tasks_on_a_client(allocation)  # else each client's one task is alone
    if same_samples:
        _check_same_samples(benchmark, allocation)
    first: list[np.ndarray] | None = None
    for name, task in benchmark.tasks.items():
        shares = _holder_shares(allocation, name, task)
        if first is None or not same_samples:
            parts = first = _partition_task(
                task, shares, sample_kind, sample_params, numpy_rng(seed, "federation", "samples", name)
            )
        else:
            parts = first
        for client, part in zip(sorted(shares), parts, strict=True):
            clients[client][name] = np.sort(part)
    return Federation(clients)


def _several_tasks_on_a_client(allocation: Allocation) -> bool:
    held = [client for shares in allocation.values() for client in (shares or {})]
    return len(held) > len(set(held))


def _check_same_samples(benchmark: Benchmark, allocation: Allocation) -> None:
    """One split can serve every task only where the tasks label the same inputs and have the same holders."""
    tasks = list(benchmark.tasks.values())
    differ = next((t.name for t in tasks[1:] if not _same_inputs(t, tasks[0])), None)
    if differ is not None:
        raise ManytaskError(f"federation.same_samples puts a client's tasks on the same samples, but task "
                            f"'{differ}' of benchmark '{benchmark.name}' does not label the inputs of task "
                            f"'{tasks[0].name}'; use a benchmark whose tasks share their inputs (scenes with images: "
                            "shared), or set federation.same_samples: false.")
    holders = {name: sorted(allocation.get(name) or {}) for name in benchmark.tasks}
    if any(h != holders[tasks[0].name] for h in holders.values()):
        raise ManytaskError("federation.same_samples puts a client's tasks on the same samples, so every task must "
                            "be held by the same clients; set federation.tasks: {kind: all}.")


def _same_inputs(task: Task, other: Task) -> bool:
    return task.x_train is other.x_train or (task.x_train.shape == other.x_train.shape
                                             and bool(torch.equal(task.x_train, other.x_train)))


def _partition_task(
    task: Task, shares: dict[int, float], kind: str, params: Params, rng: np.random.Generator
) -> list[np.ndarray]:
    """One index array per holder (in client order), naming the task in any error."""
    try:
        return SAMPLE_PARTITIONERS.get(kind).target(_task_samples(task, shares), params, rng)
    except ManytaskError as err:
        raise ManytaskError(f"partitioning task '{task.name}' with '{kind}': {err}") from None


def _holder_shares(allocation: Allocation, name: str, task: Task) -> dict[int, float]:
    shares = allocation.get(name) or {}
    if not shares:
        raise ManytaskError(f"no client holds task '{name}'; the task allocation left it out.")
    if task.num_train < len(shares):
        raise ManytaskError(
            f"task '{name}' has {task.num_train} training samples, fewer than its {len(shares)} holders; "
            "use fewer clients or another task allocation."
        )
    return shares


def _task_samples(task: Task, shares: dict[int, float]) -> TaskSamples:
    labels = None if task.labels is None else task.labels.cpu().numpy()
    weights = np.array([shares[c] for c in sorted(shares)], dtype=np.float64)
    groups = task.metadata.get("sample_groups")
    groups = None if groups is None else np.asarray(groups, dtype=np.int64)
    return TaskSamples(task.name, task.num_train, labels, weights / weights.sum(), groups)
