"""Partitioners, task allocations and `build_federation`: coverage, skew, determinism and clear errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from manytask.benchmarks.base import Benchmark
from manytask.errors import ManytaskError
from manytask.federation import (
    FEDERATION_CHOICES,
    SAMPLE_PARTITIONERS,
    TASK_ALLOCATIONS,
    Federation,
    build_federation,
)
from manytask.federation.allocation import (
    DirichletAllocationParams,
    GroupsParams,
    dirichlet_allocation,
    group_allocation,
    one_per_client,
)
from manytask.federation.partition import (
    apportion,
    dirichlet_label_partition,
    iid_partition,
    label_shard_partition,
)
from manytask.registry import Params
from manytask.rundir import RunDir
from manytask.seeding import numpy_rng
from manytask.tasks.task import Task, TaskKind, TaskSpec

SEEDS = [0, 1, 2, 3]


def assert_exact_cover(parts: list[np.ndarray], n: int) -> None:
    """Every index in 0..n-1 appears exactly once across the parts."""
    joined = np.concatenate(parts)
    assert len(joined) == n
    assert np.array_equal(np.sort(joined), np.arange(n))


def balanced_labels(n: int, classes: int, seed: int) -> np.ndarray:
    return numpy_rng(seed, "test-labels").permutation(np.arange(n) % classes)


def label_entropy(labels: np.ndarray) -> float:
    p = np.bincount(labels) / len(labels)
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())


def toy_benchmark(num_tasks: int = 3, n: int = 200, classes: int = 5, seed: int = 0) -> Benchmark:
    rng = numpy_rng(seed, "toy")
    tasks = {
        f"t{i}": (
            rng.standard_normal((n, 4)),
            rng.integers(0, classes, n),
            rng.standard_normal((20, 4)),
            rng.integers(0, classes, 20),
        )
        for i in range(num_tasks)
    }
    return Benchmark.from_tensors("toy", tasks)


# --- apportion and sample partitioners -------------------------------------------------------------------


def test_apportion_sums_and_respects_minimum() -> None:
    sizes = apportion(10, np.array([0.98, 0.01, 0.01]), minimum=1)
    assert sizes.sum() == 10 and sizes.min() >= 1
    assert list(apportion(9, np.ones(3))) == [3, 3, 3]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shares", [[1.0], [0.5, 0.5], [0.7, 0.2, 0.1], [0.01, 0.01, 0.98]])
def test_iid_partition_covers_and_follows_shares(seed: int, shares: list[float]) -> None:
    n = 1003
    parts = iid_partition(n, np.array(shares), numpy_rng(seed, "iid"))
    assert_exact_cover(parts, n)
    for part, share in zip(parts, shares, strict=True):
        assert abs(len(part) - share * n) <= 1
        assert len(part) >= 1


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("zeta", [0.1, 0.5, 10.0])
def test_dirichlet_partition_covers_and_keeps_min_size(seed: int, zeta: float) -> None:
    labels = balanced_labels(1000, 10, seed)
    parts = dirichlet_label_partition(labels, np.full(8, 1 / 8), zeta, numpy_rng(seed, "d"), min_size=5)
    assert_exact_cover(parts, len(labels))
    assert min(len(p) for p in parts) >= 5


def test_dirichlet_smaller_zeta_gives_more_label_skew() -> None:
    labels = balanced_labels(2000, 10, 0)

    def mean_entropy(zeta: float) -> float:
        values = []
        for seed in SEEDS:
            parts = dirichlet_label_partition(labels, np.full(10, 0.1), zeta, numpy_rng(seed, "d"))
            values += [label_entropy(labels[p]) for p in parts]
        return float(np.mean(values))

    skewed, mild = mean_entropy(0.1), mean_entropy(100.0)
    assert skewed < mild - 0.5
    assert mild > 0.95 * np.log(10)


def test_dirichlet_shares_weight_holder_sizes() -> None:
    labels = balanced_labels(5000, 5, 0)
    shares = np.array([0.8, 0.1, 0.1])
    sizes = np.mean(
        [[len(p) for p in dirichlet_label_partition(labels, shares, 50.0, numpy_rng(s, "d"))] for s in SEEDS],
        axis=0,
    )
    assert sizes[0] > 4 * sizes[1]


def test_dirichlet_impossible_requests_raise() -> None:
    labels = balanced_labels(20, 2, 0)
    with pytest.raises(ManytaskError, match="at least 5"):
        dirichlet_label_partition(labels, np.full(5, 0.2), 0.5, numpy_rng(0, "d"), min_size=5)
    with pytest.raises(ManytaskError, match="attempts"):
        dirichlet_label_partition(labels, np.full(4, 0.25), 0.01, numpy_rng(0, "d"), min_size=5)
    with pytest.raises(ManytaskError, match="zeta"):
        dirichlet_label_partition(labels, np.full(2, 0.5), 0.0, numpy_rng(0, "d"))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("holders", "per_client"), [(10, 2), (5, 2), (7, 3), (20, 1), (3, 4), (40, 2)])
def test_shards_cover_and_limit_classes(seed: int, holders: int, per_client: int) -> None:
    rng = numpy_rng(seed, "labels")
    labels = rng.choice(10, size=997, p=np.linspace(1, 3, 10) / np.linspace(1, 3, 10).sum())
    parts = label_shard_partition(labels, holders, per_client, numpy_rng(seed, "shards"))
    assert len(parts) == holders
    assert_exact_cover(parts, len(labels))
    assert all(len(np.unique(labels[p])) <= per_client for p in parts)
    assert all(len(p) > 0 for p in parts)


def test_shards_give_distinct_classes_when_possible() -> None:
    labels = balanced_labels(1000, 10, 0)
    for seed in SEEDS:
        parts = label_shard_partition(labels, 10, 2, numpy_rng(seed, "shards"))
        assert all(len(np.unique(labels[p])) == 2 for p in parts)


@pytest.mark.parametrize(
    ("n", "classes", "holders", "per_client", "match"),
    [
        (100, 5, 2, 6, "between 1 and 5"),
        (10, 2, 6, 2, "more than the 10 samples"),
        (100, 10, 2, 2, "cannot cover"),
    ],
)
def test_shards_impossible_requests_raise(n: int, classes: int, holders: int, per_client: int, match: str) -> None:
    with pytest.raises(ManytaskError, match=match):
        label_shard_partition(balanced_labels(n, classes, 0), holders, per_client, numpy_rng(0, "s"))


# --- task allocations ------------------------------------------------------------------------------------

TASKS = [f"t{i}" for i in range(5)]


def check_allocation(allocation: dict[str, dict[int, float]], tasks: list[str], num_clients: int) -> None:
    assert list(allocation) == tasks
    for shares in allocation.values():
        assert shares and abs(sum(shares.values()) - 1) < 1e-9
        assert all(0 <= c < num_clients and s > 0 for c, s in shares.items())
    held = {c for shares in allocation.values() for c in shares}
    assert held == set(range(num_clients))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("num_clients", [5, 7, 13])
def test_one_per_client(seed: int, num_clients: int) -> None:
    allocation = one_per_client(TASKS, num_clients, Params(), numpy_rng(seed, "a"))
    check_allocation(allocation, TASKS, num_clients)
    per_client = [sum(c in shares for shares in allocation.values()) for c in range(num_clients)]
    assert per_client == [1] * num_clients
    counts = [len(shares) for shares in allocation.values()]
    assert max(counts) - min(counts) <= 1
    with pytest.raises(ManytaskError, match="at least as many clients as tasks"):
        one_per_client(TASKS, 4, Params(), numpy_rng(seed, "a"))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("zeta", [0.05, 0.5, 5.0])
def test_dirichlet_allocation_is_valid(seed: int, zeta: float) -> None:
    params = DirichletAllocationParams(zeta=zeta)
    check_allocation(dirichlet_allocation(TASKS, 12, params, numpy_rng(seed, "a")), TASKS, 12)


def test_dirichlet_allocation_smaller_zeta_fewer_tasks_per_client() -> None:
    def mean_tasks(zeta: float) -> float:
        counts = []
        for seed in range(8):
            allocation = dirichlet_allocation(TASKS, 10, DirichletAllocationParams(zeta=zeta), numpy_rng(seed, "a"))
            counts += [sum(c in s for s in allocation.values()) for c in range(10)]
        return float(np.mean(counts))

    assert mean_tasks(0.1) < mean_tasks(10.0) - 1.5
    assert mean_tasks(10.0) > 4.5


def test_group_allocation_gives_exactly_the_group() -> None:
    groups = [["t0", "t1"], ["t2"], ["t3", "t4", "t0"]]
    allocation = group_allocation(TASKS, 7, GroupsParams(groups=groups), numpy_rng(0, "a"))
    check_allocation(allocation, TASKS, 7)
    for client in range(7):
        held = {t for t, shares in allocation.items() if client in shares}
        assert held == set(groups[client % 3])


@pytest.mark.parametrize(
    ("groups", "clients", "match"),
    [
        ([["t0", "t1", "t2", "t3"]], 3, "'t4' is in no group"),
        ([TASKS, ["nope"]], 3, "unknown task 'nope'"),
        ([TASKS, []], 3, "non-empty"),
        ([["t0", "t1"], ["t2"], ["t3", "t4"]], 2, "at least one client per group"),
    ],
)
def test_group_allocation_errors(groups: list[list[str]], clients: int, match: str) -> None:
    with pytest.raises(ManytaskError, match=match):
        group_allocation(TASKS, clients, GroupsParams(groups=groups), numpy_rng(0, "a"))


def test_all_allocation() -> None:
    allocation = TASK_ALLOCATIONS.get("all").target(TASKS, 4, Params(), numpy_rng(0, "a"))
    check_allocation(allocation, TASKS, 4)
    assert all(shares == {c: 0.25 for c in range(4)} for shares in allocation.values())


def test_registries_and_params() -> None:
    assert TASK_ALLOCATIONS.names() == ["all", "dirichlet", "groups", "one-per-client"]
    assert SAMPLE_PARTITIONERS.names() == ["dirichlet", "flwr", "iid", "label-skew", "natural", "shards"]
    assert FEDERATION_CHOICES == {"tasks": TASK_ALLOCATIONS, "samples": SAMPLE_PARTITIONERS}
    assert SAMPLE_PARTITIONERS.parse_params("dirichlet", {}).zeta == 0.5
    with pytest.raises(ManytaskError, match="zeta"):
        SAMPLE_PARTITIONERS.parse_params("dirichlet", {"zeta": 0})
    assert SAMPLE_PARTITIONERS.parse_params("dirichlet", {"alpha": 2.0}).zeta == 2.0  # the field's name for it
    with pytest.raises(ManytaskError, match="alpha"):
        SAMPLE_PARTITIONERS.parse_params("dirichlet", {"alpha": 1, "zeta": 1})
    with pytest.raises(ManytaskError, match="min_share"):
        TASK_ALLOCATIONS.parse_params("dirichlet", {"min_share": 1.5})


# --- build_federation ------------------------------------------------------------------------------------

SETTINGS = [
    (6, {}, {}),
    (7, {"kind": "one-per-client"}, {"kind": "dirichlet", "zeta": 0.2}),
    (9, {"kind": "dirichlet", "zeta": 0.3}, {"kind": "iid"}),
    (8, {"kind": "dirichlet", "zeta": 2.0}, {"kind": "dirichlet", "zeta": 1.0, "min_size": 3}),
    (4, {"kind": "all"}, {"kind": "shards", "classes_per_client": 2}),
    (5, {"kind": "groups", "groups": [["t0", "t1"], ["t2"]]}, {"kind": "iid"}),
]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("clients", "tasks", "samples"), SETTINGS)
def test_build_federation_uses_every_sample_once(seed: int, clients: int, tasks: dict, samples: dict) -> None:
    bench = toy_benchmark()
    fed = build_federation(bench, clients, tasks, samples, seed)
    assert fed.num_clients == clients
    assert all(fed.tasks_of(c) for c in range(clients))
    for name, task in bench.tasks.items():
        holders = fed.holders(name)
        assert holders
        assert_exact_cover([fed.indices(c, name) for c in holders], task.num_train)
        assert all(fed.size(c, name) > 0 for c in holders)


def test_build_federation_is_deterministic_in_seed() -> None:
    bench = toy_benchmark()
    for tasks, samples in [({"kind": "dirichlet"}, {"kind": "dirichlet"}), ({}, {})]:
        a = build_federation(bench, 8, tasks, samples, seed=3).to_json()
        b = build_federation(bench, 8, tasks, samples, seed=3).to_json()
        c = build_federation(bench, 8, tasks, samples, seed=4).to_json()
        assert a == b
        assert a != c


def test_build_federation_shards_limit_classes() -> None:
    bench = toy_benchmark(classes=5)
    fed = build_federation(bench, 6, {"kind": "all"}, {"kind": "shards", "classes_per_client": 1}, seed=0)
    for name, task in bench.tasks.items():
        for client in fed.holders(name):
            assert len(torch.unique(task.y_train[fed.indices(client, name)])) == 1


def regression_benchmark() -> Benchmark:
    x, y = torch.randn(50, 3), torch.randn(50)
    task = Task(TaskSpec("reg", TaskKind.REGRESSION, 1), x, y, x[:10], y[:10])
    return Benchmark("reg", {"reg": task})


def test_build_federation_regression_task() -> None:
    fed = build_federation(regression_benchmark(), 3, {"kind": "all"}, {"kind": "iid"}, seed=0)
    assert_exact_cover([fed.indices(c, "reg") for c in range(3)], 50)
    with pytest.raises(ManytaskError, match="regression task"):
        build_federation(regression_benchmark(), 3, {"kind": "all"}, {"kind": "dirichlet"}, seed=0)


@pytest.mark.parametrize(
    ("clients", "tasks", "samples", "match"),
    [
        (0, {}, {}, "number of clients"),
        (2, {}, {}, "at least as many clients as tasks"),
        (300, {"kind": "all"}, {}, "fewer than its 300 holders"),
        (3, {"kind": "bogus"}, {}, "unknown task allocation 'bogus'"),
        (3, {}, {"kind": "bogus"}, "unknown sample partitioner 'bogus'"),
        (3, {}, {"kind": "shards", "classes_per_client": 9}, "between 1 and 5"),
        (3, {}, {"kind": "iid", "zeta": 1}, "unknown parameter 'zeta'"),
        (3, "all", {}, "mapping"),
    ],
)
def test_build_federation_errors(clients: int, tasks: dict, samples: dict, match: str) -> None:
    with pytest.raises(ManytaskError, match=match):
        build_federation(toy_benchmark(), clients, tasks, samples, seed=0)


def test_federation_json_round_trip(tmp_path) -> None:
    bench = toy_benchmark()
    fed = build_federation(bench, 7, {"kind": "dirichlet", "zeta": 0.5}, {"kind": "dirichlet"}, seed=1)
    run_dir = RunDir(tmp_path / "run")
    run_dir.start("", fed.to_json())
    text = run_dir.federation.read_text()
    assert text.count("\n") == 1 and " " not in text  # not indented: that puts every sample index on a line
    back = Federation.from_json(json.loads(text))
    assert back.sizes() == fed.sizes()
    assert all(back.holders(t) == fed.holders(t) for t in bench.task_names)
    for client in range(fed.num_clients):
        assert back.tasks_of(client) == fed.tasks_of(client)
        for task in fed.tasks_of(client):
            assert back.indices(client, task).dtype == np.int64
            assert np.array_equal(back.indices(client, task), fed.indices(client, task))
    sizes = fed.sizes()
    assert sum(sizes[c].get("t0", 0) for c in sizes) == bench.tasks["t0"].num_train
    assert fed.size(0, "missing") == 0


def test_pooled_federation() -> None:
    fed = Federation.pooled({"a": 5, "b": 3})
    assert fed.sizes() == {0: {"a": 5}, 1: {"b": 3}}
    assert fed.holders("b") == [1]
