"""`scenes` with `buildings` (natural clients of different sizes and looks), the `natural` sample partitioner, and
Taskonomy's one client per building."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from manytask.benchmarks import build_benchmark
from manytask.benchmarks.base import Benchmark
from manytask.benchmarks.scenes import TASKS, building_sizes, building_styles, resolve_tasks
from manytask.benchmarks.scenes.render import render_scenes
from manytask.benchmarks.scenes.styles import STYLES, sample_scenes
from manytask.errors import ManytaskError
from manytask.federation import build_federation
from tests.dense_data_files import TASKONOMY_TRAIN, write_taskonomy

PARAMS = {"tasks": "sdn", "size": 16, "train_per_task": 200, "test_size": 20, "buildings": 8}
NATURAL = {"kind": "natural"}


@pytest.fixture(scope="module")
def bench() -> Benchmark:
    return build_benchmark("scenes", PARAMS, seed=0)


def test_building_sizes_spread_geometrically_in_a_seeded_order():
    sizes = building_sizes(8, 200, 4.0, seed=0)
    ladder = 4.0 ** np.linspace(0, 1, 8)
    assert sizes.sum() == 200 and sizes.min() >= 1
    assert np.abs(np.sort(sizes) - 200 * ladder / ladder.sum()).max() < 1  # the geometric ladder, rounded
    assert sizes.max() / sizes.min() == pytest.approx(4.0, rel=0.15)
    assert np.array_equal(sizes, building_sizes(8, 200, 4.0, seed=0))
    other = building_sizes(8, 200, 4.0, seed=1)
    assert np.array_equal(np.sort(other), np.sort(sizes)) and not np.array_equal(other, sizes)
    assert not np.array_equal(sizes, np.sort(sizes))  # dealt in a random order, not by building number
    assert np.array_equal(building_sizes(5, 10, 1.0, seed=0), [2] * 5)
    assert building_sizes(4, 4, 100.0, seed=0).tolist() == [1] * 4  # every building keeps one image


def test_benchmark_records_each_images_building(bench):
    groups = bench.tasks["depth"].metadata["sample_groups"]
    assert groups.dtype == np.int64 and len(groups) == 200
    assert all(np.array_equal(task.metadata["sample_groups"], groups) for task in bench.tasks.values())
    sizes = building_sizes(8, 200, 4.0, seed=0)
    assert np.array_equal(np.bincount(groups), sizes)
    assert bench.metadata["buildings"] == [{"images": int(n), "style": "studio"} for n in sizes]
    assert bench.tasks["depth"].x_test.shape == (20, 3, 16, 16)
    assert bench.metadata["test_styles"].tolist() == [0] * 20  # test images: the base styles, as without buildings
    for name, task in bench.tasks.items():
        assert task.x_train is bench.tasks["semseg"].x_train and task.spec.kind is TASKS[name].kind
    normals = bench.tasks["normals"].y_train.norm(dim=1)
    assert ((normals - 1).abs() < 1e-4).logical_or(normals == 0).all() and bench.tasks["depth"].y_train.min() >= 0
    assert (bench.tasks["semseg"].y_train >= 2).any(dim=(1, 2)).float().mean() > 0.9  # objects stay in view


def test_natural_clients_hold_their_building_for_every_task(bench):
    groups = bench.tasks["depth"].metadata["sample_groups"]
    fed = build_federation(bench, 8, {"kind": "all"}, NATURAL, seed=0)
    for client in range(8):
        assert fed.tasks_of(client) == resolve_tasks("sdn")
        for task in fed.tasks_of(client):
            assert np.array_equal(fed.indices(client, task), np.flatnonzero(groups == client))
    assert np.array_equal(fed.sizes()[3]["semseg"], np.bincount(groups)[3])


def test_buildings_of_one_base_style_look_different(bench):
    """Per-image mean colours: building means lie far apart, while two halves of one building agree."""
    colour = bench.tasks["semseg"].x_train.mean(dim=(2, 3)).numpy()
    groups = bench.tasks["semseg"].metadata["sample_groups"]
    per_building = [colour[groups == b] for b in range(8)]
    means = np.array([c.mean(0) for c in per_building])
    between = [np.linalg.norm(means[a] - means[b]) for a in range(8) for b in range(a + 1, 8)]
    within = [np.linalg.norm(c[: len(c) // 2].mean(0) - c[len(c) // 2 :].mean(0)) for c in per_building]
    assert np.median(between) > 3 * np.median(within)
    looks = building_styles(8, 1, seed=0)
    assert len({look.palette for look in looks}) == 8 and {look.texture for look in looks} == {STYLES[0].texture}


def test_same_seed_same_bytes_and_style_objects_render_as_their_ids(bench):
    again = build_benchmark("scenes", PARAMS, seed=0)
    for name, task in bench.tasks.items():
        assert task.x_train.numpy().tobytes() == again.tasks[name].x_train.numpy().tobytes()
        assert task.y_train.numpy().tobytes() == again.tasks[name].y_train.numpy().tobytes()
    ids = [0, 1, 2, 0]
    by_id = render_scenes(sample_scenes(ids, 3, "k"), 16, ["image", "depth"])
    by_style = render_scenes(sample_scenes([STYLES[i] for i in ids], 3, "k"), 16, ["image", "depth"])
    assert all(torch.equal(by_id[k], by_style[k]) for k in by_id)


def test_without_buildings_the_data_is_what_the_style_cycle_renders():
    params = {"tasks": "sd", "size": 16, "train_per_task": 12, "test_size": 6, "styles": 3}
    plain = build_benchmark("scenes", params, seed=4)
    assert plain.tasks["depth"].metadata == {} and "buildings" not in plain.metadata
    explicit = build_benchmark("scenes", {**params, "buildings": None, "size_spread": 2.0}, seed=4)
    train = render_scenes(sample_scenes([i % 3 for i in range(12)], 4, "train"), 16, ["image", "semseg", "depth"])
    test = render_scenes(sample_scenes([i % 3 for i in range(6)], 4, "test"), 16, ["image", "depth"])
    for built in (plain, explicit):
        depth = built.tasks["depth"]
        assert depth.x_train.numpy().tobytes() == train["image"].numpy().tobytes()
        assert depth.y_train.numpy().tobytes() == train["depth"].numpy().tobytes()
        assert torch.equal(built.tasks["semseg"].y_train, train["semseg"])
        assert depth.x_test.numpy().tobytes() == test["image"].numpy().tobytes()


def test_natural_and_building_errors_are_one_sentence(bench):
    plain = build_benchmark("scenes", {**PARAMS, "buildings": None, "train_per_task": 20}, seed=0)
    with pytest.raises(ManytaskError, match=r"task 'semseg'.* has no natural client split; use samples: \{kind: iid\}"):
        build_federation(plain, 4, {"kind": "all"}, NATURAL)
    with pytest.raises(ManytaskError, match=r"has 8 natural clients .* but 6 holders; set federation.num_clients: 8"):
        build_federation(bench, 6, {"kind": "all"}, NATURAL)
    with pytest.raises(ManytaskError, match="'buildings' needs images: shared"):
        build_benchmark("scenes", {**PARAMS, "images": "disjoint"}, seed=0)
    with pytest.raises(ManytaskError, match="9 buildings but only 8 training images"):
        build_benchmark("scenes", {**PARAMS, "buildings": 9, "train_per_task": 8}, seed=0)
    with pytest.raises(ManytaskError, match="size_spread"):
        build_benchmark("scenes", {**PARAMS, "size_spread": 0.5}, seed=0)


def test_taskonomy_gives_one_natural_client_per_building(tmp_path: Path):
    root = write_taskonomy(tmp_path / "taskonomy")
    split = {"root": str(root), "size": 8, "buildings": ["allensville", "beechwood"],
             "test_buildings": ["collierville"]}
    full = build_benchmark("taskonomy", {**split, "tasks": ["depth", "normals"]}, seed=0)
    groups = [0 if building == "allensville" else 1 for building, _, _ in TASKONOMY_TRAIN]
    assert full.tasks["normals"].metadata["sample_groups"].tolist() == groups
    fed = build_federation(full, 2, {"kind": "all"}, NATURAL)
    assert [fed.indices(c, t).tolist() for c in (0, 1) for t in ("depth", "normals")] == [[0, 1], [0, 1], [2], [2]]
    for seed in range(4):  # subsampling keeps each kept view's building
        sub = build_benchmark("taskonomy", {**split, "tasks": ["depth"], "max_train": 2}, seed=seed)
        kept = [next(i for i, x in enumerate(full.tasks["depth"].x_train) if torch.equal(x, y))
                for y in sub.tasks["depth"].x_train]
        assert sub.tasks["depth"].metadata["sample_groups"].tolist() == [groups[i] for i in kept]
