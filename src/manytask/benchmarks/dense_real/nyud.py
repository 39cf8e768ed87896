"""NYUD-v2 in the multi-task layout (`NYUD_MT`) of the dense multi-task references (ASTMT, Vandenhende et al.'s
Multi-Task-Learning-PyTorch, and MTI-Net/InvPT/TaskPrompter after them), and the `nyudv2` benchmark.

Layout under `root` (the extracted NYUD_MT folder), one file per image id:

    gt_sets/train.txt, gt_sets/val.txt    image ids, one per line (795 train, 654 val); val is the test split
    images/<id>.jpg                        RGB image
    segmentation/<id>.png                  uint8 class ids, 0 = unlabeled, 1..40 = the 40 NYU-Depth v2 classes
    depth/<id>.npy                         float (H, W) depth in metres, 0 = no measurement
    normals/<id>.npy                       float (H, W, 3) surface normals (x, y, z)
    edge/<id>.npy                          float (H, W) edge map, 1 = edge

Conventions, as in the references' loader: segmentation drops the unlabeled class (0 → ignored pixel 255) and
shifts the 40 classes to 0..39; depth stays in metres with 0 = missing; normals are rescaled to unit length
(all-zero = no label). Chosen here: an edge is a value above 0.5; a non-finite or negative depth counts as missing.
Resizing follows `reading`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, get_args

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
    read_id_list,
    read_label_png,
    read_npy,
    require_dir,
    resize_any,
    resize_labels,
    resize_nearest,
    resize_normals,
)
from manytask.benchmarks.registry import register_benchmark
from manytask.errors import ManytaskError
from manytask.tasks.dense_metrics import IGNORE_INDEX
from manytask.tasks.task import TaskKind

NAME = "nyudv2"
NyudTask = Literal["semseg", "depth", "normals", "edge"]
NYUD_TASKS = list(get_args(NyudTask))
NUM_CLASSES = 40


class NyudParams(DenseParams):
    tasks: list[NyudTask] = Field(default_factory=lambda: list(NYUD_TASKS), min_length=1)


def _map(path: Path, ndim: int) -> np.ndarray:
    """A .npy map with `ndim` dimensions after dropping size-1 axes (a (H, W, 1) depth reads as (H, W))."""
    array = read_npy(path)
    array = np.squeeze(array) if array.ndim > ndim else array
    if array.ndim != ndim or array.dtype.kind not in "fiub":
        raise ManytaskError(f"NYUD file {path} holds a {array.dtype} array of shape {array.shape}, not a "
                            f"{ndim}-D numeric map.")
    return array


def read_semseg(path: Path, size: int) -> Tensor:
    raw = read_label_png(path)
    check_labels(raw, NUM_CLASSES + 1, path, ignore=None)
    labels = np.where(raw == 0, IGNORE_INDEX + 1, raw) - 1  # 0 (unlabeled) → 255, class c → c - 1
    return resize_labels(labels, size)


def read_depth(path: Path, size: int) -> Tensor:
    depth = _map(path, 2).astype(np.float32)
    depth = np.where(np.isfinite(depth) & (depth > 0), depth, np.float32(0.0))
    return torch.from_numpy(np.ascontiguousarray(resize_nearest(depth, size))).unsqueeze(0)


def read_normals(path: Path, size: int) -> Tensor:
    normals = _map(path, 3)
    if normals.shape[2] != 3:
        raise ManytaskError(f"NYUD normals file {path} has shape {normals.shape}, not (H, W, 3).")
    return resize_normals(normals, size)


def read_edge(path: Path, size: int) -> Tensor:
    return resize_any(_map(path, 2) > 0.5, size)


# task -> (folder, file suffix, reader, kind, outputs, description)
TASK_FILES = {
    "semseg": ("segmentation", ".png", read_semseg, TaskKind.SEGMENTATION, NUM_CLASSES,
               "NYUD-v2 semantic segmentation, 40 classes (unlabeled pixels ignored)"),
    "depth": ("depth", ".npy", read_depth, TaskKind.DEPTH, 1, "NYUD-v2 depth in metres (0 = no measurement)"),
    "normals": ("normals", ".npy", read_normals, TaskKind.NORMALS, 3, "NYUD-v2 surface normals (unit vectors)"),
    "edge": ("edge", ".npy", read_edge, TaskKind.EDGES, 1, "NYUD-v2 boundaries (binary)"),
}


def _target(root: Path, task: str) -> Target:
    folder, suffix, read, kind, num_outputs, description = TASK_FILES[task]
    return file_target(lambda image_id: root / folder / f"{image_id}{suffix}", read, kind, num_outputs, description)


def nyud_source(root: Path, tasks: list[str]) -> DenseSource:
    """The NYUD_MT files under `root` for `tasks`, with the train and val image ids of gt_sets/."""
    require_dir(root, NAME)
    return DenseSource(
        name=NAME,
        image_file=lambda image_id: root / "images" / f"{image_id}.jpg",
        folders=[root / "images", *(root / TASK_FILES[task][0] for task in tasks)],
        train=read_id_list(root / "gt_sets" / "train.txt", f"{NAME} split list"),
        test=read_id_list(root / "gt_sets" / "val.txt", f"{NAME} split list"),
        targets={task: _target(root, task) for task in tasks},
    )


@register_benchmark(NAME, NyudParams, "NYUD-v2 dense tasks (semseg, depth, normals, edge) from the NYUD_MT files")
def nyudv2(params: NyudParams, seed: int) -> Benchmark:
    """The selected NYUD-v2 tasks on shared `size`×`size` images; `max_train` / `max_test` subsample by `seed`."""
    check_task_names(NAME, params.tasks)
    root = Path(params.root).expanduser()
    source = nyud_source(root, list(params.tasks))
    description = f"NYUD-v2 (NYUD_MT layout) from {root}: {', '.join(params.tasks)} at {params.size}x{params.size}"
    return dense_benchmark(source, params, seed, description, {"root": str(root)})
