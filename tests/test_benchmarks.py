"""Built-in benchmarks (digits-tasks, synthetic, mnist1d) and user benchmarks from tensors or datasets."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

from manytask.benchmarks import BENCHMARKS, Benchmark, build_benchmark
from manytask.benchmarks.digits import DEFAULT_TASKS as DIGITS_TASKS
from manytask.benchmarks.synthetic import make_generator
from manytask.errors import ManytaskError
from manytask.federation import build_federation
from manytask.seeding import numpy_rng, torch_generator


@pytest.fixture(scope="module")
def digits() -> Benchmark:
    return build_benchmark("digits-tasks", {}, seed=0)


def image_bytes(x: torch.Tensor) -> set[bytes]:
    return {row.tobytes() for row in x.numpy()}


def test_registry_lists_builtins() -> None:
    assert {"digits-tasks", "synthetic", "mnist1d"} <= set(BENCHMARKS.names())
    with pytest.raises(ManytaskError, match="unknown benchmark 'nope'"):
        build_benchmark("nope", {}, seed=0)


# --- digits-tasks ----------------------------------------------------------------------------------------


def test_digits_tasks_shapes_and_labels(digits: Benchmark) -> None:
    assert digits.task_names == list(DIGITS_TASKS)
    assert digits.input_shape == (1, 8, 8)
    assert digits.description and set(digits.metadata["relations"]) == set(DIGITS_TASKS)
    classes = {"digit": 10, "rotated": 10, "inverted": 10, "parity": 2, "mod3": 3, "ge5": 2, "permuted": 10}
    digit = digits.tasks["digit"]
    assert digit.num_train + len(digit.y_test) == 1797
    for name, task in digits.tasks.items():
        assert task.spec.num_outputs == classes[name] and task.description
        assert task.x_train.dtype == torch.float32
        assert float(task.x_train.min()) >= 0.0 and float(task.x_train.max()) <= 1.0
    y = digit.y_train
    assert torch.equal(digits.tasks["parity"].y_train, y % 2)
    assert torch.equal(digits.tasks["mod3"].y_train, y % 3)
    assert torch.equal(digits.tasks["ge5"].y_train, (y >= 5).long())
    assert torch.equal(digits.tasks["permuted"].y_test, digit.y_test)


def test_digits_transforms(digits: Benchmark) -> None:
    x = digits.tasks["digit"].x_train
    assert torch.equal(digits.tasks["rotated"].x_train, torch.rot90(x, 1, dims=(2, 3)))
    assert torch.allclose(digits.tasks["inverted"].x_train, 1 - x)
    permuted = digits.tasks["permuted"].x_train.flatten(1)
    assert not torch.equal(permuted, x.flatten(1))
    assert torch.equal(permuted.sort(dim=1).values, x.flatten(1).sort(dim=1).values)


def test_digits_no_test_image_in_any_training_set(digits: Benchmark) -> None:
    """Undo each transform and check no test image of the shared split is trained on by any task."""
    test_images = image_bytes(digits.tasks["digit"].x_test)
    originals = {
        "digit": lambda x: x,
        "parity": lambda x: x,
        "mod3": lambda x: x,
        "ge5": lambda x: x,
        "rotated": lambda x: torch.rot90(x, -1, dims=(2, 3)).contiguous(),
        "inverted": lambda x: 1 - x,
    }
    for name, undo in originals.items():
        task = digits.tasks[name]
        assert not image_bytes(undo(task.x_train)) & test_images
        assert image_bytes(undo(task.x_test)) == test_images
    sorted_pixels = {row.tobytes() for row in np.sort(digits.tasks["digit"].x_test.flatten(1).numpy(), axis=1)}
    permuted_train = np.sort(digits.tasks["permuted"].x_train.flatten(1).numpy(), axis=1)
    assert not {row.tobytes() for row in permuted_train} & sorted_pixels
    assert len(test_images) == len(digits.tasks["digit"].y_test)


def test_digits_split_is_stratified_and_seeded(digits: Benchmark) -> None:
    test_counts = np.bincount(digits.tasks["digit"].y_test.numpy(), minlength=10)
    assert test_counts.min() >= 40 and test_counts.max() <= 50
    again = build_benchmark("digits-tasks", {}, seed=0)
    other = build_benchmark("digits-tasks", {}, seed=1)
    assert torch.equal(again.tasks["permuted"].x_train, digits.tasks["permuted"].x_train)
    assert not torch.equal(other.tasks["digit"].x_train, digits.tasks["digit"].x_train)


def test_digits_task_selection_and_errors() -> None:
    bench = build_benchmark("digits-tasks", {"tasks": ["parity", "digit"], "test_fraction": 0.5}, seed=0)
    assert bench.task_names == ["parity", "digit"]
    assert abs(len(bench.tasks["digit"].y_test) - 1797 / 2) < 10
    assert bench.metadata["relations"]["parity"] == {"related": ["digit"], "conflicts": []}
    with pytest.raises(ManytaskError, match=r"unknown digits task 'bogus'; valid choices: .*parity"):
        build_benchmark("digits-tasks", {"tasks": ["digit", "bogus"]}, seed=0)
    with pytest.raises(ManytaskError, match="test_fraction"):
        build_benchmark("digits-tasks", {"test_fraction": 1.0}, seed=0)
    with pytest.raises(ManytaskError, match="at least one task"):
        build_benchmark("digits-tasks", {"tasks": []}, seed=0)


def test_digits_permuted_domains() -> None:
    """Three fixed pixel permutations crossed with three label maps: same pixels within a domain, different
    pixels across domains, and relations that follow the domains."""
    names = ["digit", "permuted", "permuted-parity", "permuted2", "permuted2-mod3", "permuted3"]
    bench = build_benchmark("digits-tasks", {"tasks": names}, seed=0)
    x, y = bench.tasks["digit"].x_train.flatten(1), bench.tasks["digit"].y_train
    pixels = {name: bench.tasks[name].x_train.flatten(1) for name in names}
    assert torch.equal(pixels["permuted-parity"], pixels["permuted"])
    assert torch.equal(pixels["permuted2-mod3"], pixels["permuted2"])
    assert torch.equal(bench.tasks["permuted-parity"].y_train, y % 2)
    assert torch.equal(bench.tasks["permuted2-mod3"].y_train, y % 3)
    for name in ("permuted", "permuted2", "permuted3"):
        assert torch.equal(pixels[name].sort(dim=1).values, x.sort(dim=1).values)
    distinct = {tuple(pixels[n][0].tolist()) for n in ("digit", "permuted", "permuted2", "permuted3")}
    assert len(distinct) == 4
    # `permuted` keeps the permutation it had before the other domains existed.
    default = build_benchmark("digits-tasks", {}, seed=0)
    assert torch.equal(pixels["permuted"], default.tasks["permuted"].x_train.flatten(1))
    relations = bench.metadata["relations"]
    assert relations["permuted"] == {"related": ["permuted-parity"],
                                     "conflicts": ["digit", "permuted2", "permuted2-mod3", "permuted3"]}
    assert relations["digit"]["related"] == [] and len(relations["digit"]["conflicts"]) == 5
    assert default.task_names == list(DIGITS_TASKS)
    # True groups (the domains) only where the selection is a set of clusters.
    assert "groups" not in bench.metadata and "groups" not in default.metadata
    clusters = build_benchmark("digits-tasks", {"tasks": ["permuted2", "digit", "permuted2-mod3", "parity"]}, seed=0)
    assert clusters.metadata["groups"] == {"permuted2": 0, "digit": 1, "permuted2-mod3": 0, "parity": 1}


# --- synthetic -------------------------------------------------------------------------------------------


def test_digits_are_read_as_sklearn_loads_them_without_importing_it(monkeypatch) -> None:
    """The images and labels read from scikit-learn's CSV are `load_digits()`'s, bit for bit; with the file out of
    reach the loader asks scikit-learn, with the same result."""
    import importlib.util

    from sklearn.datasets import load_digits

    from manytask.benchmarks import digits as module

    expected = load_digits()
    images, labels = module.load_images()
    assert np.array_equal(images, (expected.images / 16.0).astype(np.float32)[:, None])
    assert np.array_equal(labels, expected.target) and labels.dtype == np.int64
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert np.array_equal(module.digits_table(), np.column_stack([expected.data, expected.target]))


def test_synthetic_shapes_and_groups() -> None:
    bench = build_benchmark("synthetic", {"num_tasks": 5, "num_groups": 3, "dim": 8}, seed=0)
    assert bench.task_names == [f"task{i}" for i in range(5)]
    assert bench.input_shape == (8,)
    assert bench.metadata["groups"] == {"task0": 0, "task1": 1, "task2": 2, "task3": 0, "task4": 1}
    task = bench.tasks["task0"]
    assert (task.num_train, len(task.y_test), task.spec.num_outputs) == (600, 300, 4)
    assert np.bincount(task.y_train.numpy(), minlength=4).min() > 60  # no class is (nearly) absent


def test_synthetic_same_group_shares_the_rule_and_groups_conflict() -> None:
    params = {"num_tasks": 4, "num_groups": 2, "noise": 0.0}
    bench = build_benchmark("synthetic", params, seed=7)
    generator = make_generator(2, 32, 4, 0.0, seed=7)
    for i, task in enumerate(bench.tasks.values()):
        x = task.x_train.double().numpy()
        assert np.array_equal(generator.labels(x, i % 2, numpy_rng(0, "unused")), task.y_train.numpy())
    x = bench.tasks["task0"].x_test.double().numpy()
    rng = numpy_rng(0, "unused")
    same = generator.labels(x, 0, rng)
    assert np.array_equal(same, bench.tasks["task0"].y_test.numpy())
    assert np.mean(same == generator.labels(x, 1, rng)) < 0.6
    assert not torch.equal(bench.tasks["task0"].x_train, bench.tasks["task2"].x_train)


def test_synthetic_noise_flips_few_labels() -> None:
    bench = build_benchmark("synthetic", {"noise": 0.1}, seed=0)
    generator = make_generator(2, 32, 4, 0.0, seed=0)
    task = bench.tasks["task1"]
    clean = generator.labels(task.x_train.double().numpy(), 1, numpy_rng(0, "unused"))
    agreement = np.mean(clean == task.y_train.numpy())
    assert 0.85 < agreement < 1.0


def test_synthetic_is_seeded_and_validated() -> None:
    a = build_benchmark("synthetic", {"num_tasks": 2, "num_groups": 1}, seed=1)
    b = build_benchmark("synthetic", {"num_tasks": 2, "num_groups": 1}, seed=1)
    c = build_benchmark("synthetic", {"num_tasks": 2, "num_groups": 1}, seed=2)
    assert torch.equal(a.tasks["task1"].x_train, b.tasks["task1"].x_train)
    assert torch.equal(a.tasks["task1"].y_train, b.tasks["task1"].y_train)
    assert not torch.equal(a.tasks["task1"].x_train, c.tasks["task1"].x_train)
    with pytest.raises(ManytaskError, match="num_groups must be between 1 and num_tasks"):
        build_benchmark("synthetic", {"num_tasks": 2, "num_groups": 3}, seed=0)
    with pytest.raises(ManytaskError, match="num_classes"):
        build_benchmark("synthetic", {"num_classes": 1}, seed=0)
    with pytest.raises(ManytaskError, match="noise"):
        build_benchmark("synthetic", {"noise": -1.0}, seed=0)


def test_synthetic_is_learnable_by_a_small_mlp() -> None:
    """A quick full-batch MLP gets well above the 0.25 chance level on one task."""
    task = build_benchmark("synthetic", {"num_tasks": 1, "num_groups": 1}, seed=0).tasks["task0"]
    gen = torch_generator(0, "mlp")
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.15)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(150):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(task.x_train), task.y_train).backward()
        opt.step()
    with torch.no_grad():
        accuracy = (model(task.x_test).argmax(1) == task.y_test).float().mean().item()
    assert accuracy > 0.6


# --- mnist1d ---------------------------------------------------------------------------------------------


def test_mnist1d_builds_locally_and_restores_global_rng() -> None:
    np_state, py_state = np.random.get_state(), random.getstate()
    bench = build_benchmark("mnist1d", {"num_samples": 500}, seed=0)
    after_np, after_py = np.random.get_state(), random.getstate()
    assert np.array_equal(np_state[1], after_np[1]) and np_state[2] == after_np[2]
    assert py_state == after_py
    task = bench.tasks["mnist1d"]
    assert bench.task_names == ["mnist1d"] and bench.input_shape == (40,)
    assert (task.num_train, len(task.y_test), task.spec.num_outputs) == (400, 100, 10)
    assert task.x_train.dtype == torch.float32
    again = build_benchmark("mnist1d", {"num_samples": 500}, seed=0).tasks["mnist1d"]
    other = build_benchmark("mnist1d", {"num_samples": 500}, seed=1).tasks["mnist1d"]
    assert torch.equal(again.x_train, task.x_train)
    assert not torch.equal(other.x_train, task.x_train)
    with pytest.raises(ManytaskError, match="num_samples"):
        build_benchmark("mnist1d", {"num_samples": 10}, seed=0)


# --- user benchmarks -------------------------------------------------------------------------------------


def user_arrays(seed: int, n: int = 60) -> tuple[np.ndarray, ...]:
    rng = numpy_rng(seed, "user")
    return rng.standard_normal((n, 3)), rng.integers(0, 3, n), rng.standard_normal((10, 3)), rng.integers(0, 3, 10)


def test_from_tensors_with_numpy_and_torch() -> None:
    xa, ya, xta, yta = user_arrays(0)
    tensors = tuple(torch.as_tensor(a) for a in user_arrays(1))
    bench = Benchmark.from_tensors("mine", {"a": (xa, ya, xta, yta), "b": tensors}, "my tasks", {"k": 1})
    assert bench.task_names == ["a", "b"] and bench.input_shape == (3,)
    assert bench.metadata == {"k": 1} and bench.description == "my tasks"
    assert bench.tasks["a"].x_train.dtype == torch.float32 and bench.tasks["a"].y_train.dtype == torch.int64
    assert np.array_equal(bench.tasks["a"].y_train.numpy(), ya)
    fed = build_federation(bench, 4, {"kind": "all"}, {"kind": "dirichlet", "zeta": 1.0}, seed=0)
    assert sorted(np.concatenate([fed.indices(c, "b") for c in range(4)]).tolist()) == list(range(60))
    with pytest.raises(ValueError, match="one input shape"):
        Benchmark.from_tensors("bad", {"a": (xa, ya, xta, yta), "b": (xa[:, :2], ya, xta[:, :2], yta)})


def test_from_datasets() -> None:
    x, y, xt, yt = (torch.as_tensor(a) for a in user_arrays(2))
    bench = Benchmark.from_datasets("ds", {"t": (TensorDataset(x, y), TensorDataset(xt, yt))})
    task = bench.tasks["t"]
    assert torch.allclose(task.x_train, x.float()) and torch.equal(task.y_test, yt)
    assert task.spec.num_outputs == int(torch.cat([y, yt]).max()) + 1
