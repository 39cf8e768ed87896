"""The nyudv2, pascal-context and taskonomy loaders on tiny trees written in the real layouts (tests/dense_data_files):
shapes, kinds, label conventions worked out by hand for the 12×16 → 8×8 resize, shared inputs, seeded subsets, and
one-sentence errors naming the missing path."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from manytask.benchmarks import BENCHMARKS, build_benchmark
from manytask.benchmarks.base import Benchmark
from manytask.benchmarks.dense_real.label_edges import label_edges, thin  # importing the package registers them
from manytask.errors import ManytaskError
from manytask.tasks.task import TaskKind
from tests.dense_data_files import (
    CURVATURE_RGB,
    KEYPOINTS_RAW,
    NORMAL_RGB,
    NYUD_TRAIN,
    NYUD_VAL,
    OCCLUSION_RAW,
    PASCAL_TRAIN,
    RESHADING_RGB,
    TASKONOMY_TEST,
    TEXTURE_RAW,
    image_colour,
    taskonomy_file,
    write_nyud,
    write_parts,
    write_pascal,
    write_png,
    write_taskonomy,
)

ROWS = [0, 2, 3, 5, 6, 8, 9, 11]  # source rows of the 8 nearest-resized rows of a 12-row map
COLS = [1, 3, 5, 7, 9, 11, 13, 15]  # source columns of the 8 nearest-resized columns of a 16-column map
SIZE = 8


def build(name: str, root: Path, seed: int = 0, **params) -> Benchmark:
    return build_benchmark(name, {"root": str(root), "size": SIZE, **params}, seed)


def picked(images: torch.Tensor) -> list[int]:
    """Which written image each loaded one is: the index of the nearest `image_colour` (JPEG is off by ±1)."""
    centres = [[float(v) * 255 for v in image[:, 4, 4]] for image in images]
    return [min(range(5), key=lambda k: math.dist(centre, image_colour(k))) for centre in centres]


def assert_flat_images(images: torch.Tensor, indices: list[int], atol: float) -> None:
    assert images.shape == (len(indices), 3, SIZE, SIZE) and images.dtype == torch.float32
    for image, index in zip(images, indices, strict=True):
        want = torch.tensor(image_colour(index), dtype=torch.float32).view(3, 1, 1) / 255
        assert torch.allclose(image, want.expand(3, SIZE, SIZE), atol=atol)


def assert_shared_inputs(benchmark: Benchmark) -> None:
    tasks = list(benchmark.tasks.values())
    assert all(t.x_train is tasks[0].x_train and t.x_test is tasks[0].x_test for t in tasks)


def files_under(root: Path) -> set[Path]:
    return set(root.rglob("*"))


def normals_in_columns(vector: tuple[float, float, float], columns: slice) -> torch.Tensor:
    """(3, 8, 8): the unit `vector` in output `columns`, zero (invalid) elsewhere."""
    out = torch.zeros(3, SIZE, SIZE)
    out[:, :, columns] = (torch.tensor(vector) / math.sqrt(sum(v * v for v in vector))).view(3, 1, 1)
    return out


# ---------------------------------------------------------------- label edges (PASCAL edge ground truth)


def test_thinning_matches_the_documented_scikit_image_example() -> None:
    square = np.zeros((7, 7), dtype=bool)
    square[1:-1, 2:-2] = True
    square[0, 1] = True
    want = np.zeros((7, 7), dtype=bool)
    want[0, 1] = want[1, 2] = True
    want[2:5, 3] = True
    assert np.array_equal(thin(square), want)


def test_label_edges_are_the_thinned_laplacian_boundaries() -> None:
    labels = np.zeros((12, 16), dtype=np.uint16)
    labels[3:9, 4:12] = 5
    want = np.zeros((12, 16), dtype=bool)  # the ring OpenCV's Laplacian + scikit-image's thin give
    want[3, 4:11] = want[9, 5:11] = True
    want[4:8, 3] = want[4:9, 11] = True
    want[8, 4] = True
    assert np.array_equal(label_edges(labels), want)
    band = np.full((12, 16), 440)
    band[:, 8:] = 360
    want_band = np.zeros((12, 16), dtype=bool)
    want_band[1:, 7] = True  # the two-pixel Laplacian band (columns 7, 8) thinned to column 7
    assert np.array_equal(label_edges(band), want_band)


# ---------------------------------------------------------------- NYUD-v2


def test_nyud_all_tasks_with_reference_conventions(tmp_path: Path) -> None:
    bench = build("nyudv2", write_nyud(tmp_path / "NYUD_MT"))
    assert bench.task_names == ["semseg", "depth", "normals", "edge"]
    assert {n: (t.spec.kind, t.spec.num_outputs) for n, t in bench.tasks.items()} == {
        "semseg": (TaskKind.SEGMENTATION, 40), "depth": (TaskKind.DEPTH, 1),
        "normals": (TaskKind.NORMALS, 3), "edge": (TaskKind.EDGES, 1),
    }
    assert_shared_inputs(bench)
    semseg, depth, normals, edge = (bench.tasks[n] for n in bench.task_names)
    assert_flat_images(semseg.x_train, [0, 1, 2], atol=2 / 255)
    assert_flat_images(semseg.x_test, [3, 4], atol=2 / 255)

    # semseg: 0 (unlabeled) → 255, raw 40 - row → 39 - row
    assert semseg.y_train.shape == (3, SIZE, SIZE) and semseg.y_train.dtype == torch.int64
    want = torch.tensor([[255] * 2 + [39 - r] * 6 for r in ROWS])
    assert all(torch.equal(y, want) for y in [*semseg.y_train, *semseg.y_test])

    # depth: metres kept, 0 = missing in source columns 0-1 (output column 0)
    want_depth = torch.tensor([[0.0 if c < 2 else 0.5 + 0.25 * r + 0.01 * c for c in COLS] for r in ROWS])
    assert depth.y_train.shape == (3, 1, SIZE, SIZE) and depth.y_train.dtype == torch.float32
    assert torch.allclose(depth.y_test[1, 0], want_depth)

    # normals: (3, 0, 4) → (0.6, 0, 0.8); zero (invalid) left half stays zero
    assert normals.y_train.shape == (3, 3, SIZE, SIZE)
    assert torch.allclose(normals.y_train[0], normals_in_columns((3.0, 0.0, 4.0), slice(4, 8)), atol=1e-6)

    # edge: row 4 falls in the cells of output rows 2 and 3, column 10 in output column 5
    want_edge = torch.zeros(SIZE, SIZE)
    want_edge[2:4, :] = 1.0
    want_edge[:, 5] = 1.0
    assert edge.y_train.shape == (3, 1, SIZE, SIZE) and torch.equal(edge.y_train[2, 0], want_edge)
    assert bench.metadata["num_train"] == 3 and bench.metadata["num_test"] == 2


def test_nyud_task_subset_and_seeded_subsample(tmp_path: Path) -> None:
    root = write_nyud(tmp_path / "NYUD_MT")
    shutil.rmtree(root / "edge")  # an unselected task's folder is not needed
    one = build("nyudv2", root, seed=5, tasks=["depth"], max_train=2, max_test=1)
    again = build("nyudv2", root, seed=5, tasks=["depth"], max_train=2, max_test=1)
    assert one.task_names == ["depth"] and one.tasks["depth"].num_train == 2
    assert torch.equal(one.tasks["depth"].x_train, again.tasks["depth"].x_train)
    train, test = picked(one.tasks["depth"].x_train), picked(one.tasks["depth"].x_test)
    assert len(set(train)) == 2 and train == sorted(train) and set(train) <= {0, 1, 2} and test[0] in {3, 4}


def test_nyud_rejects_out_of_range_classes(tmp_path: Path) -> None:
    root = write_nyud(tmp_path / "NYUD_MT")
    bad = root / "segmentation" / f"{NYUD_TRAIN[1]}.png"
    write_png(bad, np.full((12, 16), 41, dtype=np.uint8))
    with pytest.raises(ManytaskError, match=f"label file {bad} holds class id 41; expected 0-40"):
        build("nyudv2", root, tasks=["semseg"])


@pytest.mark.parametrize(
    ("remove", "what"),
    [
        ("", "nyudv2 folder"),
        ("gt_sets/val.txt", "nyudv2 split list file"),
        ("depth", "nyudv2 folder"),
        (f"normals/{NYUD_VAL[1]}.npy", "nyudv2 file"),
        (f"images/{NYUD_TRAIN[0]}.jpg", "nyudv2 file"),
    ],
)
def test_nyud_missing_paths_are_named(tmp_path: Path, remove: str, what: str) -> None:
    root = write_nyud(tmp_path / "NYUD_MT")
    missing = root / remove if remove else tmp_path / "elsewhere"
    if remove:
        shutil.rmtree(missing) if missing.is_dir() else missing.unlink()
    before = files_under(tmp_path)
    with pytest.raises(ManytaskError) as err:
        build("nyudv2", root if remove else missing)
    assert str(err.value) == f"{what} {missing} is missing."
    assert files_under(tmp_path) == before  # nothing written


# ---------------------------------------------------------------- PASCAL-Context


def test_pascal_all_tasks_with_reference_conventions(tmp_path: Path) -> None:
    bench = build("pascal-context", write_pascal(tmp_path / "PASCAL_MT"))
    assert bench.task_names == ["semseg", "parts", "normals", "saliency", "edge"]
    assert {n: (t.spec.kind, t.spec.num_outputs) for n, t in bench.tasks.items()} == {
        "semseg": (TaskKind.SEGMENTATION, 21), "parts": (TaskKind.SEGMENTATION, 7),
        "normals": (TaskKind.NORMALS, 3), "saliency": (TaskKind.SALIENCY, 1), "edge": (TaskKind.EDGES, 1),
    }
    assert_shared_inputs(bench)
    semseg, parts, normals, saliency, edge = (bench.tasks[n] for n in bench.task_names)
    assert_flat_images(parts.x_train, [0, 1, 2], atol=2 / 255)
    assert_flat_images(parts.x_test, [3, 4], atol=2 / 255)

    # semseg: stored ids kept (0 background, 15 person, 255 ignored); image 1 reads semseg/VOC12 (all 7)
    want = torch.tensor([[255] * 8] + [[0] * 4 + [15] * 4 for _ in ROWS[1:]])
    assert torch.equal(semseg.y_train[0], want) and torch.equal(semseg.y_test[1], want)
    assert torch.equal(semseg.y_train[1], torch.full((SIZE, SIZE), 7))

    # parts: head rows 0-3 → 1, torso rows 4-7 → 2, lower leg rows 8-11 → 6 (dog parts ignored); no parts → 255
    groups = {0: 1, 2: 1, 3: 1, 5: 2, 6: 2, 8: 6, 9: 6, 11: 6}
    want_parts = torch.tensor([[0] * 4 + [groups[r]] * 4 for r in ROWS])
    assert parts.y_train.dtype == torch.int64 and torch.equal(parts.y_train[0], want_parts)
    assert torch.equal(parts.y_train[1], torch.full((SIZE, SIZE), 255))
    assert torch.equal(parts.y_test[0], torch.full((SIZE, SIZE), 255))

    # normals (0, 255, 255) → (-1, 1, 1)/√3 on wall (NYUD-like), zero on sky; the resize keeps 4 valid columns
    assert torch.allclose(normals.y_train[2], normals_in_columns((-1.0, 1.0, 1.0), slice(0, 4)), atol=1e-6)

    # saliency: 128 → 1 (rows 0-5), 127 → 0
    want_sal = torch.tensor([[1.0 if r < 6 else 0.0] * SIZE for r in ROWS])
    assert saliency.y_test.shape == (2, 1, SIZE, SIZE) and torch.equal(saliency.y_test[0, 0], want_sal)

    # edge: the wall/sky boundary thinned to source column 7 (rows 1-11) → output column 3
    want_edge = torch.zeros(SIZE, SIZE)
    want_edge[:, 3] = 1.0
    assert torch.equal(edge.y_train[0, 0], want_edge)


def test_pascal_rejects_unknown_person_parts(tmp_path: Path) -> None:
    root = write_pascal(tmp_path / "PASCAL_MT")
    bad = root / "human_parts" / f"{PASCAL_TRAIN[2]}.mat"
    write_parts(bad, [("person", 15, [("tail", np.ones((12, 16), dtype=bool))])])
    with pytest.raises(ManytaskError, match="names an unknown person part 'tail'"):
        build("pascal-context", root, tasks=["parts"])


@pytest.mark.parametrize(
    ("remove", "tasks", "what"),
    [
        ("ImageSets/Context/train.txt", ["semseg"], "pascal-context split list file"),
        ("pascal-context/trainval", ["normals"], "pascal-context folder"),
        (f"human_parts/{PASCAL_TRAIN[1]}.mat", ["parts"], "pascal-context file"),
        (f"semseg/pascal-context/{PASCAL_TRAIN[0]}.png", ["semseg"], "pascal-context file"),
    ],
)
def test_pascal_missing_paths_are_named(tmp_path: Path, remove: str, tasks: list[str], what: str) -> None:
    root = write_pascal(tmp_path / "PASCAL_MT")
    missing = root / remove
    shutil.rmtree(missing) if missing.is_dir() else missing.unlink()
    before = files_under(tmp_path)
    with pytest.raises(ManytaskError) as err:
        build("pascal-context", root, tasks=tasks)
    assert str(err.value) == f"{what} {missing} is missing."
    assert files_under(tmp_path) == before


# ---------------------------------------------------------------- Taskonomy

SPLIT = {"buildings": ["allensville", "beechwood"], "test_buildings": ["collierville"]}


def test_taskonomy_nine_tasks_with_reference_conventions(tmp_path: Path) -> None:
    bench = build("taskonomy", write_taskonomy(tmp_path / "taskonomy"), **SPLIT)
    assert bench.task_names == ["semseg", "depth", "normals", "keypoints", "texture_edges", "occlusion_edges",
                                "reshading", "curvature", "autoencoding"]
    assert {n: (t.spec.kind, t.spec.num_outputs) for n, t in bench.tasks.items()} == {
        "semseg": (TaskKind.SEGMENTATION, 17), "depth": (TaskKind.DEPTH, 1), "normals": (TaskKind.NORMALS, 3),
        "keypoints": (TaskKind.HEATMAP, 1), "texture_edges": (TaskKind.RECONSTRUCTION, 1),
        "occlusion_edges": (TaskKind.RECONSTRUCTION, 1), "reshading": (TaskKind.RECONSTRUCTION, 1),
        "curvature": (TaskKind.RECONSTRUCTION, 2), "autoencoding": (TaskKind.RECONSTRUCTION, 3),
    }
    assert_shared_inputs(bench)
    tasks = bench.tasks
    # PNG inputs are exact; views by building, then point numerically (2 before 10), then view
    assert_flat_images(tasks["depth"].x_train, [0, 1, 2], atol=1e-6)
    assert_flat_images(tasks["depth"].x_test, [3, 4], atol=1e-6)
    assert tasks["autoencoding"].y_train is tasks["autoencoding"].x_train
    assert tasks["autoencoding"].y_test is tasks["autoencoding"].x_test

    # semseg: 0 (uncertain) → 255, background 1 → 0, class 17 → 16
    want = torch.tensor([[255] * 8] + [[0] * 4 + [16] * 4 for _ in ROWS[1:]])
    assert all(torch.equal(y, want) for y in [*tasks["semseg"].y_train, *tasks["semseg"].y_test])

    # depth: raw / 512 metres = row + 1 + column / 4; 65535 → 0 (missing)
    want_depth = torch.tensor([[0.0 if c < 2 else r + 1 + c / 4 for c in COLS] for r in ROWS])
    assert torch.equal(tasks["depth"].y_train[1, 0], want_depth)

    # normals: (255, 128, 0) → (1, 1/255, -1) normalized; mid-grey (source columns 0-3) has no direction → zero
    normals = tasks["normals"].y_test[0]
    assert NORMAL_RGB == (255, 128, 0)
    assert torch.allclose(normals, normals_in_columns((1.0, 1 / 255, -1.0), slice(2, 8)), atol=1e-6)

    # continuous maps, standardized with the task-grouping loader's constants
    flat = {
        "keypoints": (KEYPOINTS_RAW - 50.0) / 100.0,
        "texture_edges": (TEXTURE_RAW - 718.0) / 1070.0,
        "occlusion_edges": (OCCLUSION_RAW - 56.0248) / 239.1265,
        "reshading": (sum(RESHADING_RGB) / 3 / 255 - 0.4962) / 0.2846,
    }
    for task, value in flat.items():
        y = tasks[task].y_train
        assert y.shape == (3, 1, SIZE, SIZE) and y.dtype == torch.float32
        assert torch.allclose(y, torch.full_like(y, value), atol=1e-5), task
    curvature = tasks["curvature"].y_test
    assert curvature.shape == (2, 2, SIZE, SIZE)
    want_curvature = [(CURVATURE_RGB[0] / 255 - 0.5175) / 0.1373, (CURVATURE_RGB[1] / 255 - 0.4987) / 0.0359]
    for channel, value in enumerate(want_curvature):
        assert torch.allclose(curvature[:, channel], torch.full((2, SIZE, SIZE), value), atol=1e-5)


def test_taskonomy_seeded_subsample_and_split_checks(tmp_path: Path) -> None:
    root = write_taskonomy(tmp_path / "taskonomy")
    one = build("taskonomy", root, seed=2, tasks=["semseg", "autoencoding"], max_train=2, **SPLIT)
    again = build("taskonomy", root, seed=2, tasks=["semseg", "autoencoding"], max_train=2, **SPLIT)
    x = one.tasks["semseg"].x_train
    assert len(x) == 2 and torch.equal(x, again.tasks["semseg"].x_train)
    train = picked(x)
    assert len(set(train)) == 2 and train == sorted(train) and picked(one.tasks["semseg"].x_test) == [3, 4]
    with pytest.raises(ManytaskError, match="building 'beechwood' is listed more than once"):
        build("taskonomy", root, buildings=["allensville", "beechwood"], test_buildings=["beechwood"])
    with pytest.raises(ManytaskError, match="missing required parameter 'test_buildings'"):
        build("taskonomy", root, buildings=["allensville"])


@pytest.mark.parametrize(
    ("missing_of", "tasks", "what"),
    [
        (lambda root: root / "collierville" / "rgb", ["depth"], "taskonomy folder"),
        (lambda root: root / "beechwood" / "edge_texture", ["texture_edges"], "taskonomy folder"),
        (lambda root: taskonomy_file(root, TASKONOMY_TEST[1], "normal"), ["normals"], "taskonomy file"),
    ],
)
def test_taskonomy_missing_paths_are_named(tmp_path: Path, missing_of, tasks: list[str], what: str) -> None:
    root = write_taskonomy(tmp_path / "taskonomy")
    missing = missing_of(root)
    shutil.rmtree(missing) if missing.is_dir() else missing.unlink()
    before = files_under(tmp_path)
    with pytest.raises(ManytaskError) as err:
        build("taskonomy", root, tasks=tasks, **SPLIT)
    assert str(err.value) == f"{what} {missing} is missing."
    assert files_under(tmp_path) == before


def test_taskonomy_depth_must_be_16_bit(tmp_path: Path) -> None:
    root = write_taskonomy(tmp_path / "taskonomy")
    bad = taskonomy_file(root, TASKONOMY_TEST[0], "depth_zbuffer")
    write_png(bad, np.full((12, 16), 9, dtype=np.uint8))
    with pytest.raises(ManytaskError, match=f"depth file {bad} is a L image, not a 16-bit PNG"):
        build("taskonomy", root, tasks=["depth"], **SPLIT)


# ---------------------------------------------------------------- parameters


@pytest.mark.parametrize("name", ["nyudv2", "pascal-context", "taskonomy"])
def test_registered_with_validated_task_lists(tmp_path: Path, name: str) -> None:
    assert name in BENCHMARKS.names()
    with pytest.raises(ManytaskError, match="tasks"):
        build(name, tmp_path, tasks=["nope"], **(SPLIT if name == "taskonomy" else {}))
    with pytest.raises(ManytaskError, match="lists a task twice"):
        build(name, tmp_path, tasks=["depth" if name != "pascal-context" else "edge"] * 2,
              **(SPLIT if name == "taskonomy" else {}))
