"""What the dense real-data loaders share: checked file access, readers of the on-disk formats, resizing to the
benchmark's square resolution, and assembling the tasks of one benchmark around one shared image tensor.

Every path a benchmark will read is checked before the first file is opened, so a wrong `root` or an incomplete
copy fails at once with one sentence naming the exact missing path. Loaders only read; nothing is written.

Resizing (every map goes to `size`×`size`, whatever its aspect ratio, like the references' fixed 512×512 resize):
- images and continuous maps: bilinear with antialiasing (torch `interpolate(..., antialias=True)`), so a large
  downsampling averages instead of aliasing;
- normals: each source vector made unit length (or invalid, all zero), resized bilinearly, then renormalized; a
  resized vector shorter than MIN_NORMAL_LENGTH is invalid;
- label maps and depth: nearest neighbour at pixel centres (source index ⌊(i + ½)·H/size⌋), so no class ids or
  depths are invented between regions (the references resize depth with nearest too, as 0 marks no measurement);
- binary edge maps: an output pixel is an edge when any source pixel in its cell is (adaptive max pooling), so
  one-pixel contours stay connected lines instead of being mostly skipped by nearest sampling.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor

from manytask.benchmarks.base import Benchmark
from manytask.errors import ManytaskError
from manytask.extras import require
from manytask.registry import Params
from manytask.seeding import numpy_rng
from manytask.tasks.dense_metrics import IGNORE_INDEX
from manytask.tasks.task import Task, TaskKind, dense_task

MIN_NORMAL_LENGTH = 0.5
"""A normal shorter than this is invalid (all zero): a stored vector this short encodes no direction (e.g. a mid-grey
127/128 pixel of an 8-bit normal map), and a resized one got most of its bilinear weight from invalid pixels."""


class DenseParams(Params):
    """Parameters every dense real-data benchmark takes; each benchmark adds its `tasks` (and more)."""

    root: str
    size: int = Field(64, ge=1)
    max_train: int | None = Field(None, ge=1)
    max_test: int | None = Field(None, ge=1)


@dataclass(frozen=True)
class Target:
    """One task of a dataset: its kind and output channels, the files it reads for an example, and how it turns
    them into a `size`×`size` target (`read(example, size)`); `read` None means the target is the input image
    itself (autoencoding), passed as the very same tensor."""

    kind: TaskKind
    num_outputs: int
    files: Callable[[Any], list[Path]]
    read: Callable[[Any, int], Tensor] | None
    description: str


def file_target(
    path_of: Callable[[Any], Path], read: Callable[[Path, int], Tensor], kind: TaskKind, num_outputs: int,
    description: str,
) -> Target:
    """A target read from one file per example, `read(path, size)`."""
    return Target(kind, num_outputs, lambda example: [path_of(example)],
                  lambda example, size: read(path_of(example), size), description)


# ---------------------------------------------------------------- checks


def require_dir(path: Path, what: str) -> None:
    if not path.is_dir():
        raise ManytaskError(f"{what} folder {path} is missing.")


def require_file(path: Path, what: str) -> None:
    if not path.is_file():
        raise ManytaskError(f"{what} file {path} is missing.")


def check_task_names(benchmark: str, tasks: Sequence[str]) -> None:
    if len(set(tasks)) != len(tasks):
        raise ManytaskError(f"benchmark '{benchmark}' lists a task twice in 'tasks'; give each task at most once.")


def read_id_list(path: Path, what: str) -> list[str]:
    """The non-empty lines of a split list (one image id per line), after checking the file exists."""
    require_file(path, what)
    ids = [line.strip() for line in path.read_text().splitlines() if line.strip()]
    if not ids:
        raise ManytaskError(f"{what} file {path} lists no images.")
    return ids


# ---------------------------------------------------------------- readers


def read_png_mode(path: Path, convert: str | None = None) -> tuple[np.ndarray, str]:
    """The pixel array of an image file as stored ((H, W) for grey, palette and 16-bit images, (H, W, C) for
    colour) and its Pillow mode (e.g. 'I;16' for 16-bit grey), or converted to mode `convert` first."""
    Image = require("PIL.Image", "reading the dense datasets")
    try:
        with Image.open(path) as image:
            image = image.convert(convert) if convert else image
            return np.asarray(image).copy(), image.mode
    except OSError as err:
        raise ManytaskError(f"could not read image {path}: {err}.") from None


def read_png(path: Path) -> np.ndarray:
    """The pixel array of an image file as stored (see `read_png_mode`)."""
    return read_png_mode(path)[0]


def read_rgb(path: Path) -> np.ndarray:
    """An image file as (H, W, 3) uint8 RGB (grey, palette and RGBA images converted)."""
    return read_png_mode(path, "RGB")[0]


def read_npy(path: Path) -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError) as err:
        raise ManytaskError(f"could not read numpy file {path}: {err}.") from None


def read_mat(path: Path) -> dict[str, Any]:
    """The variables of a MATLAB (v4-v7.2) file, as nested numpy arrays (scipy's default struct layout)."""
    from scipy.io import loadmat

    try:
        return loadmat(path)
    except (OSError, ValueError, TypeError, NotImplementedError) as err:
        raise ManytaskError(f"could not read MATLAB file {path}: {err}.") from None


def read_label_png(path: Path) -> np.ndarray:
    """The int64 (H, W) class ids of a single-channel (grey or palette) label image."""
    labels = read_png(path)
    if labels.ndim != 2:
        raise ManytaskError(f"label file {path} has {labels.shape[2]} channels; expected one class id per pixel.")
    return labels.astype(np.int64)


def first_channel(array: np.ndarray) -> np.ndarray:
    """A single-channel map from a grey (H, W) or colour (H, W, C) image file."""
    return array if array.ndim == 2 else array[..., 0]


def check_labels(labels: np.ndarray, num_classes: int, path: Path, ignore: int | None = IGNORE_INDEX) -> None:
    """Fail on a class id outside 0..num_classes-1 that is not the file format's `ignore` value."""
    bad = labels[((labels < 0) | (labels >= num_classes)) & (labels != ignore)]
    if bad.size:
        allowed = f"0-{num_classes - 1}" + ("" if ignore is None else f" or {ignore}")
        raise ManytaskError(f"label file {path} holds class id {int(bad.flat[0])}; expected {allowed}.")


# ---------------------------------------------------------------- resizing


def _interpolate(maps: Tensor, size: int) -> Tensor:
    """(C, H, W) → (C, size, size), bilinear with antialiasing."""
    if tuple(maps.shape[-2:]) == (size, size):
        return maps.contiguous()
    return F.interpolate(maps[None], size=(size, size), mode="bilinear", align_corners=False, antialias=True)[0]


def resize_bilinear(array: np.ndarray, size: int) -> Tensor:
    """(H, W) or (H, W, C) values → float32 (C, size, size), bilinear with antialiasing."""
    values = torch.from_numpy(np.asarray(array, dtype=np.float32))
    values = values.unsqueeze(-1) if values.dim() == 2 else values
    return _interpolate(values.permute(2, 0, 1), size)


def nearest_indices(length: int, size: int) -> np.ndarray:
    """Source index of each of `size` output pixels under nearest sampling at pixel centres."""
    return np.minimum(((np.arange(size) + 0.5) * length / size).astype(np.int64), length - 1)


def resize_nearest(array: np.ndarray, size: int) -> np.ndarray:
    """(H, W[, C]) → (size, size[, C]) by nearest neighbour at pixel centres."""
    rows, cols = nearest_indices(array.shape[0], size), nearest_indices(array.shape[1], size)
    return array[np.ix_(rows, cols)]


def resize_any(mask: np.ndarray, size: int) -> Tensor:
    """(H, W) binary map → float32 (1, size, size): 1 where any source pixel of the output cell is set."""
    values = torch.from_numpy(np.asarray(mask, dtype=np.float32))[None, None]
    return F.adaptive_max_pool2d(values, (size, size))[0]


def unit_normals(normals: Tensor) -> Tensor:
    """(3, H, W) vectors scaled to unit length; those shorter than MIN_NORMAL_LENGTH become all zero (invalid)."""
    length = normals.norm(dim=0, keepdim=True)
    valid = length >= MIN_NORMAL_LENGTH
    return torch.where(valid, normals / length.clamp_min(MIN_NORMAL_LENGTH), torch.zeros_like(normals))


def resize_normals(normals: np.ndarray, size: int) -> Tensor:
    """(H, W, 3) normals → float32 (3, size, size) unit vectors: each made unit (or invalid) first, so that a
    resized pixel is valid when most of its bilinear weight comes from valid pixels, then resized and renormalized."""
    vectors = torch.from_numpy(np.nan_to_num(np.asarray(normals, dtype=np.float32))).permute(2, 0, 1)
    return unit_normals(_interpolate(unit_normals(vectors), size))


def resize_labels(labels: np.ndarray, size: int) -> Tensor:
    """(H, W) class ids → int64 (size, size), nearest neighbour."""
    return torch.from_numpy(resize_nearest(labels, size).astype(np.int64))


def image_tensor(rgb: np.ndarray, size: int) -> Tensor:
    """(H, W, 3) uint8 RGB → float32 (3, size, size) in [0, 1]."""
    return resize_bilinear(rgb.astype(np.float32) / 255.0, size).clamp_(0.0, 1.0)


# ---------------------------------------------------------------- assembling a benchmark


def choose(examples: list, limit: int | None, rng: np.random.Generator) -> list:
    """At most `limit` random examples, kept in their original order; all of them when `limit` is None."""
    if limit is None or limit >= len(examples):
        return list(examples)
    keep = np.sort(rng.choice(len(examples), size=limit, replace=False))
    return [examples[i] for i in keep]


@dataclass(frozen=True)
class DenseSource:
    """A dataset on disk: its name (the benchmark's), the image file of an example, the folders that must exist,
    the train and test examples, the selected tasks' targets, and the natural group of a training example (e.g.
    its building; None: the dataset has no natural client split)."""

    name: str
    image_file: Callable[[Any], Path]
    folders: list[Path]
    train: list
    test: list
    targets: dict[str, Target]
    group: Callable[[Any], int] | None = None


def check_files(source: DenseSource, examples: list) -> None:
    """Fail on the first missing folder or file the examples need, before anything is read."""
    for folder in source.folders:
        require_dir(folder, source.name)
    for example in examples:
        require_file(source.image_file(example), source.name)
        for target in source.targets.values():
            for path in target.files(example):
                require_file(path, source.name)


def load_split(source: DenseSource, examples: list, size: int) -> tuple[Tensor, dict[str, Tensor]]:
    """Images (N, 3, size, size) and every target of `examples`, read in parallel threads."""
    read = {task: target.read for task, target in source.targets.items() if target.read is not None}

    def load(example: Any) -> tuple[Tensor, dict[str, Tensor]]:
        image = image_tensor(read_rgb(source.image_file(example)), size)
        return image, {task: read_target(example, size) for task, read_target in read.items()}

    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        loaded = list(pool.map(load, examples))  # list(): re-raises the first error
    images = torch.stack([image for image, _ in loaded])
    targets = {task: torch.stack([ys[task] for _, ys in loaded]) if task in read else images for task in source.targets}
    return images, targets


def dense_benchmark(source: DenseSource, params: DenseParams, seed: int, description: str, metadata: dict) -> Benchmark:
    """Every selected task of `source` on one shared pair of image tensors, after seeded subsampling; with
    `source.group`, every task's metadata `sample_groups` is the group of each kept training example."""
    train = choose(source.train, params.max_train, numpy_rng(seed, source.name, "train"))
    test = choose(source.test, params.max_test, numpy_rng(seed, source.name, "test"))
    check_files(source, train + test)
    x_train, y_train = load_split(source, train, params.size)
    x_test, y_test = load_split(source, test, params.size)
    tasks: dict[str, Task] = {
        task: dense_task(task, target.kind, x_train, y_train[task], x_test, y_test[task], target.num_outputs,
                         description=target.description)
        for task, target in source.targets.items()
    }
    if source.group is not None:
        groups = np.array([source.group(example) for example in train], dtype=np.int64)
        for task in tasks.values():
            task.metadata["sample_groups"] = groups
    info = {"size": params.size, "num_train": len(train), "num_test": len(test), **metadata}
    return Benchmark(source.name, tasks, description, info)
