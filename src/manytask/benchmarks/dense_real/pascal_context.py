"""PASCAL-Context in the multi-task layout (`PASCAL_MT`) of the dense multi-task references (ASTMT, Vandenhende et
al.'s Multi-Task-Learning-PyTorch, MTI-Net/InvPT/TaskPrompter), and the `pascal-context` benchmark.

Layout under `root` (the extracted PASCAL_MT folder), one file per image id:

    ImageSets/Context/train.txt, val.txt  image ids, one per line (4998 train, 5105 val); val is the test split
    JPEGImages/<id>.jpg                    RGB image
    semseg/VOC12/<id>.png                  class ids 0..20 (used when present), else
    semseg/pascal-context/<id>.png         class ids 0..20: background + the 20 VOC classes, 255 = ignored
    human_parts/<id>.mat                   Pascal-Part annotation: struct `anno` with `objects` (fields class,
                                           class_ind, mask, parts) and per object `parts` (part_name, mask)
    normals_distill/<id>.png               RGB normals distilled from a NYUD-trained model, n = 2·v/255 − 1
    sal_distill/<id>.png                   grey saliency distilled from a saliency model, v/255 in [0, 1]
    pascal-context/trainval/<id>.mat       `LabelMap`: the full 459-class PASCAL-Context label map

Conventions, as in the references' loader:
- semseg: the 21 classes stored in the PNGs (0 background, 1..20 aeroplane..tvmonitor), 255 kept as ignored;
- parts: 7 classes (0 background, then head, torso, upper arm, lower arm, upper leg, lower leg: the references'
  6-part grouping of the 24 Pascal-Part person parts, drawn from every person object with parts); an image without
  such a person is ignored entirely (every pixel 255), as there is nothing to learn parts from;
- normals: decoded from the PNG and kept only on pixels whose `LabelMap` class also exists in NYUD (the classes
  the distilling model was trained on, plus tvmonitor), elsewhere all zero (no label); then unit length;
- saliency: v/255 > 0.5 (binary);
- edge: the thinned boundaries between `LabelMap` regions (see `label_edges`), binary.
The references keep the whole val list and score parts only on images with persons; here the all-ignored maps do
the same. Resizing follows `reading`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np
import torch
from pydantic import Field
from torch import Tensor

from manytask.benchmarks.base import Benchmark
from manytask.benchmarks.dense_real.label_edges import label_edges
from manytask.benchmarks.dense_real.reading import (
    DenseParams,
    DenseSource,
    Target,
    check_labels,
    check_task_names,
    dense_benchmark,
    file_target,
    first_channel,
    read_id_list,
    read_label_png,
    read_mat,
    read_png,
    read_rgb,
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

NAME = "pascal-context"
PascalTask = Literal["semseg", "parts", "normals", "saliency", "edge"]
PASCAL_TASKS = list(get_args(PascalTask))
NUM_SEMSEG_CLASSES = 21
NUM_PART_CLASSES = 7
PERSON = 15  # Pascal-Part class_ind of a person

# Pascal-Part person part -> one of the 6 groups (1 head, 2 torso, 3 upper arm, 4 lower arm / hand,
# 5 upper leg, 6 lower leg / foot), as in the references' 6-part setting.
PART_GROUPS = {
    **dict.fromkeys(["hair", "head", "lear", "lebrow", "leye", "mouth", "nose", "rear", "rebrow", "reye"], 1),
    **dict.fromkeys(["neck", "torso"], 2),
    **dict.fromkeys(["luarm", "ruarm"], 3),
    **dict.fromkeys(["lhand", "llarm", "rhand", "rlarm"], 4),
    **dict.fromkeys(["luleg", "ruleg"], 5),
    **dict.fromkeys(["lfoot", "llleg", "rfoot", "rlleg"], 6),
}

# PASCAL-Context classes (ids of its 459-class list) whose name is also an NYUD class (except 'unknown'), plus
# tvmonitor (427): where the distilled normals are trusted.
NORMALS_VALID_CLASSES = np.array([
    3, 4, 6, 9, 10, 11, 13, 15, 17, 18, 22, 23, 29, 30, 33, 34, 36, 37, 38, 39, 41, 43, 46, 49, 50, 51, 53, 55,
    56, 59, 61, 62, 65, 66, 68, 69, 72, 73, 78, 83, 84, 85, 87, 88, 95, 96, 101, 104, 105, 107, 111, 113, 115,
    122, 124, 135, 141, 142, 143, 146, 150, 154, 157, 158, 159, 165, 172, 174, 181, 183, 184, 191, 193, 195,
    197, 199, 202, 213, 215, 216, 219, 220, 223, 225, 228, 230, 232, 233, 238, 239, 242, 243, 246, 250, 251,
    252, 255, 260, 261, 263, 269, 272, 273, 275, 281, 283, 284, 285, 286, 287, 288, 290, 291, 292, 293, 295,
    304, 307, 309, 310, 314, 315, 319, 323, 329, 330, 331, 336, 342, 345, 349, 350, 351, 352, 355, 357, 368,
    370, 371, 374, 379, 380, 383, 384, 397, 401, 403, 405, 407, 408, 411, 412, 413, 414, 417, 419, 421, 423,
    427, 429, 430, 432, 440, 441, 442, 443, 444, 446, 454, 457,
])


class PascalParams(DenseParams):
    tasks: list[PascalTask] = Field(default_factory=lambda: list(PASCAL_TASKS), min_length=1)


def read_label_map(path: Path) -> np.ndarray:
    """The (H, W) `LabelMap` of a PASCAL-Context annotation file."""
    label_map = read_mat(path).get("LabelMap")
    if not isinstance(label_map, np.ndarray) or label_map.ndim != 2:
        raise ManytaskError(f"PASCAL-Context file {path} has no 2-D 'LabelMap' variable.")
    return label_map.astype(np.int64)


def read_semseg(path: Path, size: int) -> Tensor:
    labels = read_label_png(path)
    check_labels(labels, NUM_SEMSEG_CLASSES, path)
    return resize_labels(labels, size)


def _person_parts(path: Path) -> list[tuple[str, np.ndarray]]:
    """(part name, boolean mask) of every part of every person object in a Pascal-Part annotation file."""
    try:
        objects = read_mat(path)["anno"][0, 0]["objects"].ravel()
        parts = [obj["parts"].ravel() for obj in objects if int(obj["class_ind"].squeeze()) == PERSON]
        return [(str(part["part_name"].squeeze()), part["mask"].astype(bool)) for group in parts for part in group]
    except (KeyError, IndexError, ValueError, TypeError) as err:
        raise ManytaskError(f"human parts file {path} is not a Pascal-Part annotation ({err}).") from None


def read_parts(path: Path, size: int) -> Tensor:
    parts = _person_parts(path)
    if not parts:
        return torch.full((size, size), IGNORE_INDEX, dtype=torch.int64)
    labels = np.zeros(parts[0][1].shape, dtype=np.int64)
    for name, mask in parts:
        if name not in PART_GROUPS:
            raise ManytaskError(f"human parts file {path} names an unknown person part '{name}'.")
        labels[mask] = PART_GROUPS[name]
    return resize_labels(labels, size)


def read_normals(paths: list[Path], size: int) -> Tensor:
    """Normals of `normals_distill/<id>.png`, kept on the NYUD-like classes of `pascal-context/trainval/<id>.mat`."""
    normals_path, label_path = paths
    normals = 2.0 * read_rgb(normals_path).astype(np.float32) / 255.0 - 1.0
    label_map = read_label_map(label_path)
    if label_map.shape != normals.shape[:2]:
        raise ManytaskError(f"PASCAL-Context file {label_path} is {label_map.shape[1]}x{label_map.shape[0]} but "
                            f"{normals_path} is {normals.shape[1]}x{normals.shape[0]}.")
    normals[~np.isin(label_map, NORMALS_VALID_CLASSES)] = 0.0
    return resize_normals(normals, size)


def read_saliency(path: Path, size: int) -> Tensor:
    salient = first_channel(read_png(path)).astype(np.float32) / 255.0 > 0.5
    return torch.from_numpy(resize_nearest(salient, size).astype(np.float32)).unsqueeze(0)


def read_edge(path: Path, size: int) -> Tensor:
    return resize_any(label_edges(read_label_map(path)), size)


def _semseg_file(root: Path, image_id: str) -> Path:
    """semseg/VOC12/<id>.png when it exists, else semseg/pascal-context/<id>.png (the references' order)."""
    voc = root / "semseg" / "VOC12" / f"{image_id}.png"
    return voc if voc.is_file() else root / "semseg" / "pascal-context" / f"{image_id}.png"


def _targets(root: Path) -> dict[str, Target]:
    def in_folder(*parts: str, suffix: str):
        return lambda image_id: root.joinpath(*parts, f"{image_id}{suffix}")

    label_map = in_folder("pascal-context", "trainval", suffix=".mat")
    normals = in_folder("normals_distill", suffix=".png")

    def normals_files(image_id: Any) -> list[Path]:
        return [normals(image_id), label_map(image_id)]

    return {
        "semseg": file_target(lambda i: _semseg_file(root, i), read_semseg, TaskKind.SEGMENTATION,
                              NUM_SEMSEG_CLASSES, "PASCAL-Context semantic segmentation, background + 20 VOC classes"),
        "parts": file_target(in_folder("human_parts", suffix=".mat"), read_parts, TaskKind.SEGMENTATION,
                             NUM_PART_CLASSES, "PASCAL-Context human parts, background + 6 parts (no person: ignored)"),
        "normals": Target(TaskKind.NORMALS, 3, normals_files, lambda i, s: read_normals(normals_files(i), s),
                          "PASCAL-Context distilled surface normals (unit vectors, NYUD-like classes only)"),
        "saliency": file_target(in_folder("sal_distill", suffix=".png"), read_saliency, TaskKind.SALIENCY, 1,
                                "PASCAL-Context distilled saliency (binary)"),
        "edge": file_target(label_map, read_edge, TaskKind.EDGES, 1, "PASCAL-Context region boundaries (binary)"),
    }


# task -> folders it reads from
TASK_FOLDERS = {
    "semseg": [("semseg",)],
    "parts": [("human_parts",)],
    "normals": [("normals_distill",), ("pascal-context", "trainval")],
    "saliency": [("sal_distill",)],
    "edge": [("pascal-context", "trainval")],
}


def pascal_source(root: Path, tasks: list[str]) -> DenseSource:
    """The PASCAL_MT files under `root` for `tasks`, with the train and val image ids of ImageSets/Context/."""
    require_dir(root, NAME)
    folders = [root / "JPEGImages"]
    for task in tasks:
        folders += [root.joinpath(*parts) for parts in TASK_FOLDERS[task] if root.joinpath(*parts) not in folders]
    targets = _targets(root)
    return DenseSource(
        name=NAME,
        image_file=lambda image_id: root / "JPEGImages" / f"{image_id}.jpg",
        folders=folders,
        train=read_id_list(root / "ImageSets" / "Context" / "train.txt", f"{NAME} split list"),
        test=read_id_list(root / "ImageSets" / "Context" / "val.txt", f"{NAME} split list"),
        targets={task: targets[task] for task in tasks},
    )


@register_benchmark(
    NAME, PascalParams, "PASCAL-Context dense tasks (semseg, parts, normals, saliency, edge) from the PASCAL_MT files"
)
def pascal_context(params: PascalParams, seed: int) -> Benchmark:
    """The selected PASCAL-Context tasks on shared `size`×`size` images; `max_train` / `max_test` subsample by
    `seed`."""
    check_task_names(NAME, params.tasks)
    root = Path(params.root).expanduser()
    source = pascal_source(root, list(params.tasks))
    description = (
        f"PASCAL-Context (PASCAL_MT layout) from {root}: {', '.join(params.tasks)} at {params.size}x{params.size}"
    )
    return dense_benchmark(source, params, seed, description, {"root": str(root)})
