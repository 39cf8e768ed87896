"""Image classification tasks read from ImageFolder directories, and `vision-8`, the 8-task vision benchmark.

`vision-8` is the task set of MaTU and task arithmetic (SUN397, Stanford Cars, RESISC45, EuroSAT, SVHN, GTSRB,
MNIST, DTD), read from local files only. Expected layout (one ImageFolder per task and split):

    ROOT/<task>/train/<class>/<image>.png|jpg|jpeg|bmp|ppm|webp
    ROOT/<task>/test/<class>/<image>...

with tasks named `sun397, cars, resisc45, eurosat, svhn, gtsrb, mnist, dtd` (any other directory names work
too via `tasks`). To produce it, write every (image, label) pair of each original dataset's train and test split to
`ROOT/<task>/<split>/<class name>/<index>.png`, e.g. by iterating torchvision's or Hugging Face `datasets`' copies
of the datasets on a machine with internet access. Datasets without an official test split (SUN397, RESISC45,
EuroSAT, DTD) use the splits of the task-arithmetic code (Ilharco et al. 2023); any fixed split works. Images of
any size and mode are accepted: each is converted to RGB, its shorter side resized to `image_size` (bicubic, like
CLIP's preprocessing) and center-cropped to a square.

Test labels use the training split's class list, so a test class must also exist in train. All images are held in
memory as float32 (3·size²·4 bytes each: 0.6 MB at 224 px), so the full benchmark needs on the order of 100 GB;
use `max_per_class` (applied to both splits, chosen by the seed) to keep it small.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
from pydantic import Field
from torch import Tensor

from manytask.benchmarks.base import Benchmark
from manytask.benchmarks.registry import register_benchmark
from manytask.errors import ManytaskError
from manytask.extras import require
from manytask.registry import Params
from manytask.seeding import numpy_rng
from manytask.tasks.task import Task, classification_task

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".ppm", ".webp")
VISION8_TASKS = ["sun397", "cars", "resisc45", "eurosat", "svhn", "gtsrb", "mnist", "dtd"]
SPLITS = ("train", "test")
LAYOUT = "<task>/{train,test}/<class>/"


def list_image_folder(root: Path) -> tuple[list[Path], list[int], list[str]]:
    """Image paths of an ImageFolder `root/<class>/...` (sorted), their labels (index of the sorted class name), and
    the class names. Subdirectories of a class directory are searched too; hidden entries are skipped."""
    root = Path(root)
    if not root.is_dir():
        raise ManytaskError(f"image folder {root} does not exist (expected {root}/<class>/<image>).")
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    paths: list[Path] = []
    labels: list[int] = []
    for label, name in enumerate(classes):
        found = sorted(_images_under(root / name))
        paths += found
        labels += [label] * len(found)
    if not paths:
        suffixes = "|".join(s[1:] for s in IMAGE_SUFFIXES)
        raise ManytaskError(f"image folder {root} has no images (expected {root}/<class>/<image>.{suffixes}).")
    return paths, labels, classes


def _images_under(directory: Path) -> list[Path]:
    found = []
    for dirpath, dirnames, filenames in os.walk(directory):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        found += [
            Path(dirpath, f) for f in filenames
            if not f.startswith(".") and Path(f).suffix.lower() in IMAGE_SUFFIXES
        ]
    return found


def load_images(paths: list[Path], size: int) -> Tensor:
    """Float tensor `[N, 3, size, size]` in [0, 1]: RGB, shorter side resized to `size` (bicubic), center crop."""
    Image = require("PIL.Image", "reading image folders")

    out = torch.empty((len(paths), 3, size, size), dtype=torch.float32)

    def load(index: int) -> None:
        path = paths[index]
        try:
            with Image.open(path) as image:
                image = _square(image.convert("RGB"), size, Image.Resampling.BICUBIC)
        except OSError as err:
            raise ManytaskError(f"could not read image {path}: {err}.") from None
        out[index] = torch.from_numpy(np.asarray(image, dtype=np.uint8).copy()).permute(2, 0, 1).float() / 255.0

    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        list(pool.map(load, range(len(paths))))  # list(): re-raises the first error
    return out


def _square(image, size: int, resample):  # PIL images; PIL is imported lazily
    width, height = image.size
    scale = size / min(width, height)
    new = (max(size, round(width * scale)), max(size, round(height * scale)))
    if new != (width, height):
        image = image.resize(new, resample)
    left, top = (new[0] - size) // 2, (new[1] - size) // 2
    return image.crop((left, top, left + size, top + size))


def load_image_folder(root: Path, size: int) -> tuple[Tensor, Tensor, list[str]]:
    """An ImageFolder `root/<class>/<image>` as images `[N, 3, size, size]` in [0, 1], labels (by sorted class
    name) and class names; images in sorted path order."""
    paths, labels, classes = list_image_folder(root)
    return load_images(paths, size), torch.tensor(labels, dtype=torch.long), classes


def subsample_per_class(labels: list[int], max_per_class: int | None, rng: np.random.Generator) -> list[int]:
    """Indices keeping at most `max_per_class` random items of each label, in their original order."""
    if max_per_class is None:
        return list(range(len(labels)))
    by_label: dict[int, list[int]] = {}
    for index, label in enumerate(labels):
        by_label.setdefault(label, []).append(index)
    kept = []
    for label in sorted(by_label):
        members = by_label[label]
        if len(members) > max_per_class:
            members = sorted(rng.choice(members, size=max_per_class, replace=False).tolist())
        kept += members
    return sorted(kept)


class Vision8Params(Params):
    root: str
    tasks: list[str] = Field(default=list(VISION8_TASKS), min_length=1)
    image_size: int = Field(224, ge=1)
    max_per_class: int | None = Field(None, ge=1)


def _check_layout(root: Path, tasks: list[str]) -> None:
    if len(set(tasks)) != len(tasks):
        raise ManytaskError("benchmark 'vision-8' lists a task twice; give each task at most once.")
    for task in tasks:
        if not task or task.startswith(".") or any(c in task for c in "./\\"):
            raise ManytaskError(f"vision-8 task '{task}' must be a plain directory name (no '.', '/' or '\\').")
    missing = next(
        (p for p in [root, *(root / t / s for t in tasks for s in SPLITS)] if not p.is_dir()), None
    )
    if missing is not None:
        raise ManytaskError(f"vision-8 needs ImageFolder directories at {root}/{LAYOUT}; missing: {missing}.")


def _load_task(root: Path, task: str, params: Vision8Params, seed: int) -> tuple[Task, list[str]]:
    train_paths, train_labels, classes = list_image_folder(root / task / "train")
    test_paths, test_raw, test_classes = list_image_folder(root / task / "test")
    index = {name: i for i, name in enumerate(classes)}
    unknown = [name for name in test_classes if name not in index]
    if unknown:
        raise ManytaskError(
            f"vision-8 task '{task}': test class '{unknown[0]}' has no directory in {root / task / 'train'}."
        )
    test_labels = [index[test_classes[label]] for label in test_raw]
    split_data = []
    for split, paths, labels in (("train", train_paths, train_labels), ("test", test_paths, test_labels)):
        keep = subsample_per_class(labels, params.max_per_class, numpy_rng(seed, "vision-8", task, split))
        x = load_images([paths[i] for i in keep], params.image_size)
        split_data += [x, torch.tensor([labels[i] for i in keep], dtype=torch.long)]
    description = f"{task}: {len(classes)} classes from {root / task}"
    return classification_task(task, *split_data, num_classes=len(classes), description=description), classes


@register_benchmark(
    "vision-8", Vision8Params, "8 image tasks (SUN397, Cars, ..., DTD) from local ImageFolder dirs (MaTU, ViT-B/32)"
)
def vision8(params: Vision8Params, seed: int) -> Benchmark:
    """Build the selected tasks from `root/<task>/{train,test}/<class>/`; `max_per_class` subsamples by `seed`."""
    root = Path(params.root).expanduser()
    _check_layout(root, params.tasks)
    tasks: dict[str, Task] = {}
    classes: dict[str, list[str]] = {}
    for task in params.tasks:
        tasks[task], classes[task] = _load_task(root, task, params, seed)
    description = (
        f"image classification tasks read from ImageFolder directories under {root} "
        f"({params.image_size}px RGB in [0, 1])"
    )
    return Benchmark("vision-8", tasks, description, {"classes": classes, "root": str(root)})
