"""`thirty-tasks`: 30 tasks over 8×8 digits and Fashion-MNIST, on tiny fake Fashion-MNIST files: the names, shapes
and label spaces, how a task's inputs and labels derive from its dataset's shared split, the domains, the
pretraining source, determinism, and one-sentence errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from manytask.benchmarks import BENCHMARKS, build_benchmark
from manytask.benchmarks.thirty_tasks import TASKS, domain, shrink_to_8x8
from manytask.errors import ManytaskError
from tests.data_files import write_mnist

SIZES = {"train_per_dataset": 40, "test_per_dataset": 20, "source_per_dataset": 30}


@pytest.fixture(scope="module")
def fashion_root(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("fashion")
    write_mnist(root, gz=True, num_train=120, num_test=30)
    return str(root)


@pytest.fixture(scope="module")
def bench(fashion_root):
    return build_benchmark("thirty-tasks", {**SIZES, "fashion_root": fashion_root}, seed=0)


def test_thirty_tasks_five_inputs_by_three_label_spaces(bench):
    assert "thirty-tasks" in BENCHMARKS.names() and len(TASKS) == 30 and bench.task_names == list(TASKS)
    assert bench.input_shape == (1, 8, 8)
    classes = {name: task.spec.num_outputs for name, task in bench.tasks.items()}
    assert classes["digits"] == classes["fashion-rotated"] == 10
    assert classes["digits-parity"] == 2 and classes["fashion-permuted-mod3"] == 3
    for task in bench.tasks.values():
        assert len(task.y_train) == 40 and len(task.y_test) == 20
        assert float(task.x_train.min()) >= 0 and float(task.x_train.max()) <= 1


def test_a_dataset_s_tasks_share_its_split(bench):
    plain, tasks = bench.tasks["digits"], bench.tasks
    assert torch.equal(tasks["digits-parity"].x_train, plain.x_train)
    assert torch.equal(tasks["digits-parity"].y_train, plain.y_train % 2)
    assert torch.equal(tasks["digits-mod3"].y_test, plain.y_test % 3)
    assert torch.equal(tasks["digits-rotated"].x_train, torch.rot90(plain.x_train, 1, dims=(2, 3)))
    assert torch.equal(tasks["digits-inverted"].x_test, 1 - plain.x_test)
    assert torch.equal(tasks["digits-mirrored"].x_train, torch.flip(plain.x_train, dims=(3,)))
    flat, permuted = plain.x_train.flatten(1), tasks["digits-permuted"].x_train.flatten(1)
    assert torch.equal(permuted.sort(dim=1).values, flat.sort(dim=1).values) and not torch.equal(permuted, flat)
    same = tasks["digits-permuted-parity"].x_train.flatten(1)
    assert torch.equal(same, permuted)  # one permutation per dataset


def test_fashion_is_averaged_down_to_8x8():
    images = torch.arange(2 * 28 * 28, dtype=torch.float32).reshape(2, 1, 28, 28) / (2 * 28 * 28)
    small = shrink_to_8x8(images)
    assert small.shape == (2, 1, 8, 8)
    assert float(small.mean()) == pytest.approx(float(images.mean()), rel=0.05)


def test_domains_and_pretraining_source(bench):
    groups = bench.metadata["groups"]
    assert bench.metadata["domains"] == ["digits", "digits-permuted", "fashion", "fashion-permuted"]
    assert groups["digits-rotated-mod3"] == groups["digits"] != groups["digits-permuted-parity"]
    assert groups["fashion-permuted"] == 3 and domain("fashion-inverted-parity") == "fashion"
    source = bench.pretraining
    assert source is not None and source.spec.num_outputs == 20
    assert len(source.y_train) + len(source.y_test) == 2 * 30  # held out of each dataset
    assert set(torch.cat([source.y_train, source.y_test]).tolist()) >= {0, 9, 10, 19}


def test_deterministic_in_the_seed_and_a_selection(fashion_root):
    params = {**SIZES, "fashion_root": fashion_root, "tasks": ["fashion-mirrored", "digits-mod3"]}
    one, again = (build_benchmark("thirty-tasks", params, seed=3) for _ in range(2))
    other = build_benchmark("thirty-tasks", params, seed=4)
    assert one.task_names == ["fashion-mirrored", "digits-mod3"] and "groups" not in one.metadata  # no clusters
    assert torch.equal(one.tasks["digits-mod3"].x_train, again.tasks["digits-mod3"].x_train)
    assert not torch.equal(one.tasks["digits-mod3"].x_train, other.tasks["digits-mod3"].x_train)
    without = build_benchmark("thirty-tasks", {**params, "source_per_dataset": 0}, seed=3)
    assert without.pretraining is None


def test_one_sentence_errors(tmp_path: Path, fashion_root):
    for tasks, words in (([], "at least one task"), (["digits", "digits"], "twice"), (["digit"], "thirty-tasks task")):
        with pytest.raises(ManytaskError, match=words):
            build_benchmark("thirty-tasks", {"tasks": tasks, "fashion_root": fashion_root}, seed=0)
    with pytest.raises(ManytaskError) as info:
        build_benchmark("thirty-tasks", {"fashion_root": str(tmp_path / "absent")}, seed=0)
    message = str(info.value)
    assert "Fashion-MNIST" in message and str(tmp_path / "absent") in message and "\n" not in message
