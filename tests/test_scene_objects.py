"""The `scene-objects` benchmark: class counts and balance, disjoint task and source classes from the form x colour
grid, the target rule, determinism in the seed, and one sentence for too many classes."""

import numpy as np
import pytest
import torch

from manytask.benchmarks import build_benchmark
from manytask.benchmarks.scene_objects import (
    COLOURS,
    FORMS,
    GRID_SIZE,
    TARGET_CELL,
    class_name,
    sample_object_scenes,
    split_classes,
)
from manytask.benchmarks.scenes.styles import CELL, GRID, footprints
from manytask.errors import ManytaskError

SMALL = {"classes": 10, "source_classes": 4, "train_per_class": 3, "test_per_class": 2, "source_per_class": 2,
         "size": 16}


@pytest.fixture(scope="module")
def small():
    return build_benchmark("scene-objects", SMALL, seed=0)


def test_task_and_source_have_balanced_labels_and_images_in_range(small):
    task, source = small.tasks["objects"], small.pretraining
    assert list(small.tasks) == ["objects"] and source.name == "source"
    assert task.spec.num_outputs == 10 and source.spec.num_outputs == 4
    for x, y, per_class, classes in [(task.x_train, task.y_train, 3, 10), (task.x_test, task.y_test, 2, 10),
                                     (source.x_train, source.y_train, 2, 4), (source.x_test, source.y_test, 2, 4)]:
        assert x.shape == (per_class * classes, 3, 16, 16) and x.dtype == torch.float32
        assert float(x.min()) >= 0 and float(x.max()) <= 1
        assert torch.bincount(y, minlength=classes).tolist() == [per_class] * classes


def test_task_and_source_classes_are_disjoint_combinations_of_the_grid(small):
    grid = {class_name(c) for c in range(GRID_SIZE)}
    names, source = small.metadata["class_names"], small.metadata["source_class_names"]
    assert GRID_SIZE == len(grid) == len(FORMS) * len(COLOURS) >= 128
    assert len(set(names)) == 10 and len(set(source)) == 4
    assert set(names) <= grid and set(source) <= grid and not set(names) & set(source)


def test_the_target_stands_in_the_front_centre_cell_and_shows_its_class():
    task, _ = split_classes(10, 4)
    combinations = task[np.arange(200) % 10]
    objects = sample_object_scenes(combinations, 0, "check").objects
    target = objects.slot == 0
    assert target.sum() == 200 and objects.image[target].tolist() == list(range(200))
    front = torch.tensor(GRID[TARGET_CELL], dtype=torch.float32)
    in_front = ((objects.center[:, [0, 2]] - front).abs() < CELL / 2).all(1)
    assert in_front[target].all() and not in_front[~target].any()
    forms = torch.tensor([FORMS[c // len(COLOURS)].kind for c in combinations])
    assert torch.equal(objects.kind[target], forms)
    assert 0 < (~target).sum() < 3 * 200  # 0 to 3 distractors per image
    assert (footprints(objects.kind.numpy(), objects.size.numpy()) <= CELL / 2).all()  # objects never meet


def test_same_seed_gives_identical_tensors_and_another_seed_other_images(small):
    again = build_benchmark("scene-objects", SMALL, seed=0)
    other = build_benchmark("scene-objects", SMALL, seed=1)
    for a, b in [(small.tasks["objects"], again.tasks["objects"]), (small.pretraining, again.pretraining)]:
        for name in ("x_train", "y_train", "x_test", "y_test"):
            assert torch.equal(getattr(a, name), getattr(b, name))
    task, task_other = small.tasks["objects"], other.tasks["objects"]
    assert torch.equal(task.y_train, task_other.y_train) and not torch.equal(task.x_train, task_other.x_train)


def test_train_test_and_source_images_are_drawn_with_different_keys(small):
    task, source = small.tasks["objects"], small.pretraining
    images = torch.cat([task.x_train, task.x_test, source.x_train, source.x_test]).flatten(1)
    assert len(torch.unique(images, dim=0)) == len(images)


def test_no_source_without_source_classes():
    built = build_benchmark("scene-objects", {**SMALL, "source_classes": 0}, seed=0)
    assert built.pretraining is None and built.metadata["source_class_names"] == []


def test_too_many_classes_is_one_sentence_naming_the_grid_size():
    with pytest.raises(ManytaskError, match=f"scene-objects has {GRID_SIZE} form x colour classes, fewer than the "
                                            "120 task \\+ 28 source classes"):
        build_benchmark("scene-objects", {"classes": 120}, seed=0)
    with pytest.raises(ManytaskError, match="parameter 'classes'"):
        build_benchmark("scene-objects", {"classes": 0}, seed=0)
