"""Taskonomy in its original per-building layout, and the `taskonomy` benchmark with the nine tasks of the
Taskonomy multi-task studies (Standley et al.'s task-grouping code: semantic segmentation, z-buffer depth, normals,
2D keypoints, texture edges, occlusion edges, reshading, principal curvature, autoencoding).

Layout under `root`, one folder per building and per domain, one PNG per view:

    <building>/rgb/point_<i>_view_<j>_domain_rgb.png                      RGB image (512×512)
    <building>/<domain>/point_<i>_view_<j>_domain_<domain>.png            its label in `domain`

| task            | domain              | file                    | target                                        |
|-----------------|---------------------|-------------------------|-----------------------------------------------|
| semseg          | segment_semantic    | 8-bit ids 0..17         | 0 (uncertain) → 255 (ignored), c → c − 1:     |
|                 |                     |                         | 17 classes (background + 16 COCO classes)     |
| depth           | depth_zbuffer       | 16-bit, 1/512 m         | v / 512 metres; 65535 (none) → 0 = missing    |
| normals         | normal              | RGB, 127-centred        | n = 2·v/255 − 1, then unit length             |
| keypoints       | keypoints2d         | grey (8/16-bit) heatmap | (v − 50) / 100                                |
| texture_edges   | edge_texture        | 16-bit                  | (v − 718) / 1070                              |
| occlusion_edges | edge_occlusion      | 16-bit                  | (v − 56.0248) / 239.1265                      |
| reshading       | reshading           | RGB                     | (channel mean of v/255 − 0.4962) / 0.2846     |
| curvature       | principal_curvature | RGB, first 2 channels   | (v/255 − (0.5175, 0.4987)) / (0.1373, 0.0359) |
| autoencoding    | rgb                 | the input itself        | the image tensor in [0, 1] (same object)      |

The segmentation and depth conventions follow the dataset's README (class 0 "uncertain" must not contribute to
the loss; depth units 1/512 m, 65535 the maximum, 128 m). The continuous targets are standardized with the
per-domain means and deviations of the task-grouping code's loader, so their L1 losses have comparable scales;
texture and occlusion edges are therefore continuous (reconstruction kind, L1) as in that code, not binary.
Chosen here: normals closer to zero than `reading.MIN_NORMAL_LENGTH` are invalid; nothing else is masked by the
depth (that code also masks some L1 losses by valid depth). `buildings` are the training buildings and
`test_buildings` the test buildings (e.g. from the official split files); a building may not be in both. Views
are ordered by building (as listed), then point, then view; every task's metadata `sample_groups` holds each
training view's building (its position in `buildings`), so `samples: {kind: natural}` makes one client per
building. Resizing follows `reading`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Literal, NamedTuple, get_args

import numpy as np
import torch
from pydantic import Field
from torch import Tensor

from manytask.benchmarks.base import Benchmark
from manytask.benchmarks.dense_real.reading import (
    DenseParams,
    DenseSource,
    Target,
    check_labels,
    check_task_names,
    dense_benchmark,
    file_target,
    first_channel,
    read_label_png,
    read_png,
    read_png_mode,
    require_dir,
    resize_bilinear,
    resize_labels,
    resize_nearest,
    resize_normals,
)
from manytask.benchmarks.registry import register_benchmark
from manytask.errors import ManytaskError
from manytask.tasks.dense_metrics import IGNORE_INDEX
from manytask.tasks.task import TaskKind

NAME = "taskonomy"
TaskonomyTask = Literal[
    "semseg", "depth", "normals", "keypoints", "texture_edges", "occlusion_edges", "reshading", "curvature",
    "autoencoding",
]
TASKONOMY_TASKS = list(get_args(TaskonomyTask))
NUM_CLASSES = 17  # background + 16 COCO classes, after dropping "uncertain"
DEPTH_UNITS_PER_METRE = 512.0
DEPTH_MISSING = 65535
RGB_NAME = re.compile(r"point_(\d+)_view_(\d+)_domain_rgb\.png")


class View(NamedTuple):
    """One image: a camera view of a point in a building."""

    building: str
    point: int
    view: int


class TaskonomyParams(DenseParams):
    tasks: list[TaskonomyTask] = Field(default_factory=lambda: list(TASKONOMY_TASKS), min_length=1)
    buildings: list[str] = Field(min_length=1)
    test_buildings: list[str] = Field(min_length=1)


def view_file(root: Path, view: View, domain: str) -> Path:
    return root / view.building / domain / f"point_{view.point}_view_{view.view}_domain_{domain}.png"


def list_views(root: Path, building: str) -> list[View]:
    """The views of a building, from the names of its rgb/ files, by point then view."""
    folder = root / building / "rgb"
    require_dir(folder, NAME)
    found = (RGB_NAME.fullmatch(path.name) for path in folder.iterdir())
    views = sorted(View(building, int(m[1]), int(m[2])) for m in found if m)
    if not views:
        raise ManytaskError(f"{NAME} folder {folder} has no point_<i>_view_<j>_domain_rgb.png images.")
    return views


def read_semseg(path: Path, size: int) -> Tensor:
    raw = read_label_png(path)
    check_labels(raw, NUM_CLASSES + 1, path, ignore=None)
    return resize_labels(np.where(raw == 0, IGNORE_INDEX + 1, raw) - 1, size)  # 0 (uncertain) → 255, c → c − 1


def read_depth(path: Path, size: int) -> Tensor:
    raw, mode = read_png_mode(path)
    if not mode.startswith("I"):
        raise ManytaskError(f"Taskonomy depth file {path} is a {mode} image, not a 16-bit PNG.")
    raw = resize_nearest(raw.astype(np.float32), size)
    depth = np.where(raw == DEPTH_MISSING, np.float32(0.0), raw / np.float32(DEPTH_UNITS_PER_METRE))
    return torch.from_numpy(np.ascontiguousarray(depth)).unsqueeze(0)


def read_normals(path: Path, size: int) -> Tensor:
    normals = 2.0 * read_png(path)[..., :3].astype(np.float32) / 255.0 - 1.0
    return resize_normals(normals, size)


def standardized(mean: float, std: float) -> Callable[[Path, int], Tensor]:
    """A reader of a one-channel map giving (raw value − mean) / std, resized bilinearly."""

    def read(path: Path, size: int) -> Tensor:
        return (resize_bilinear(first_channel(read_png(path)), size) - mean) / std

    return read


def read_reshading(path: Path, size: int) -> Tensor:
    shading = read_png(path).astype(np.float32) / 255.0
    shading = shading[..., :3].mean(axis=2) if shading.ndim == 3 else shading
    return (resize_bilinear(shading, size) - 0.4962) / 0.2846


CURVATURE_MEAN = torch.tensor([0.5175, 0.4987]).view(2, 1, 1)
CURVATURE_STD = torch.tensor([0.1373, 0.0359]).view(2, 1, 1)


def read_curvature(path: Path, size: int) -> Tensor:
    curvature = read_png(path)
    if curvature.ndim != 3:
        raise ManytaskError(f"Taskonomy curvature file {path} is not a colour image (2 curvature channels).")
    return (resize_bilinear(curvature[..., :2].astype(np.float32) / 255.0, size) - CURVATURE_MEAN) / CURVATURE_STD


# task -> (domain folder, reader, kind, outputs, description)
TASK_DOMAINS = {
    "semseg": ("segment_semantic", read_semseg, TaskKind.SEGMENTATION, NUM_CLASSES,
               "Taskonomy semantic segmentation, background + 16 COCO classes (uncertain pixels ignored)"),
    "depth": ("depth_zbuffer", read_depth, TaskKind.DEPTH, 1, "Taskonomy z-buffer depth in metres (0 = missing)"),
    "normals": ("normal", read_normals, TaskKind.NORMALS, 3, "Taskonomy surface normals (unit vectors)"),
    "keypoints": ("keypoints2d", standardized(50.0, 100.0), TaskKind.HEATMAP, 1,
                  "Taskonomy 2D keypoint heatmap (standardized)"),
    "texture_edges": ("edge_texture", standardized(718.0, 1070.0), TaskKind.RECONSTRUCTION, 1,
                      "Taskonomy texture (2D) edge strength (standardized)"),
    "occlusion_edges": ("edge_occlusion", standardized(56.0248, 239.1265), TaskKind.RECONSTRUCTION, 1,
                        "Taskonomy occlusion (3D) edge strength (standardized)"),
    "reshading": ("reshading", read_reshading, TaskKind.RECONSTRUCTION, 1, "Taskonomy reshading (standardized)"),
    "curvature": ("principal_curvature", read_curvature, TaskKind.RECONSTRUCTION, 2,
                  "Taskonomy principal curvatures (standardized)"),
}


def _target(root: Path, task: str) -> Target:
    if task == "autoencoding":
        return Target(TaskKind.RECONSTRUCTION, 3, lambda view: [], None, "Taskonomy autoencoding (the input image)")
    domain, read, kind, num_outputs, description = TASK_DOMAINS[task]
    return file_target(lambda view: view_file(root, view, domain), read, kind, num_outputs, description)


def _check_buildings(params: TaskonomyParams) -> None:
    for building in [*params.buildings, *params.test_buildings]:
        if not building or building.startswith(".") or any(c in building for c in "/\\"):
            raise ManytaskError(f"Taskonomy building '{building}' must be a plain folder name (no '/' or '\\').")
    listed = params.buildings + params.test_buildings
    repeated = next((b for i, b in enumerate(listed) if b in listed[:i]), None)
    if repeated is not None:
        raise ManytaskError(
            f"Taskonomy building '{repeated}' is listed more than once across 'buildings' and 'test_buildings'."
        )


def taskonomy_source(root: Path, tasks: list[str], buildings: list[str], test_buildings: list[str]) -> DenseSource:
    """The Taskonomy files under `root` for `tasks`: views of `buildings` to train on, of `test_buildings` to test;
    a training view's group is its building's position in `buildings`."""
    require_dir(root, NAME)
    domains = [TASK_DOMAINS[task][0] for task in tasks if task in TASK_DOMAINS]
    building_index = {building: b for b, building in enumerate(buildings)}
    return DenseSource(
        name=NAME,
        image_file=lambda view: view_file(root, view, "rgb"),
        folders=[root / building / domain for building in buildings + test_buildings for domain in domains],
        train=[view for building in buildings for view in list_views(root, building)],
        test=[view for building in test_buildings for view in list_views(root, building)],
        targets={task: _target(root, task) for task in tasks},
        group=lambda view: building_index[view.building],
    )


@register_benchmark(NAME, TaskonomyParams, "Taskonomy's nine dense tasks from the per-building folders")
def taskonomy(params: TaskonomyParams, seed: int) -> Benchmark:
    """The selected Taskonomy tasks on shared `size`×`size` images: train views from `buildings`, test views from
    `test_buildings`; `max_train` / `max_test` subsample by `seed`."""
    check_task_names(NAME, params.tasks)
    _check_buildings(params)
    root = Path(params.root).expanduser()
    source = taskonomy_source(root, list(params.tasks), list(params.buildings), list(params.test_buildings))
    description = f"Taskonomy from {root}: {', '.join(params.tasks)} at {params.size}x{params.size}"
    metadata = {"root": str(root), "buildings": list(params.buildings), "test_buildings": list(params.test_buildings)}
    return dense_benchmark(source, params, seed, description, metadata)
