"""`scenes`: procedural dense multi-task learning on ray-cast scenes of spheres, boxes and cylinders.

Every target is exact from the geometry (see `geometry.py` and `render.py`), so NYUD- or PASCAL-like task sets (and the
Taskonomy-like letters of MAS) can be built at any size without downloading a dataset. Images are either shared
by all tasks (one dataset, many labels, like NYUD-v2) or rendered per task (each task its own images and style).
Shared images may come from `buildings`, each with its own look and number of images, like Taskonomy's buildings:
the natural clients of the `natural` sample partitioner.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from pydantic import Field

from manytask.benchmarks.base import Benchmark
from manytask.benchmarks.registry import register_benchmark
from manytask.benchmarks.scenes.geometry import CLASS_NAMES, PART_NAMES
from manytask.benchmarks.scenes.render import render_scenes
from manytask.benchmarks.scenes.styles import STYLES, Style, building_style, sample_scenes
from manytask.errors import ManytaskError, unknown_choice
from manytask.federation.partition import apportion
from manytask.registry import Params
from manytask.seeding import numpy_rng
from manytask.tasks.task import Task, TaskKind, dense_task


@dataclass(frozen=True)
class SceneTask:
    """How a task name maps to a rendered target, its kind and the channels a model outputs."""

    target: str
    kind: TaskKind
    num_outputs: int
    description: str


TASKS: dict[str, SceneTask] = {
    "semseg": SceneTask("semseg", TaskKind.SEGMENTATION, len(CLASS_NAMES), f"classes {', '.join(CLASS_NAMES)}"),
    "parts": SceneTask("parts", TaskKind.SEGMENTATION, len(PART_NAMES), f"parts {', '.join(PART_NAMES)}"),
    "depth": SceneTask("depth", TaskKind.DEPTH, 1, "camera-space depth"),
    "normals": SceneTask("normals", TaskKind.NORMALS, 3, "unit surface normals in camera coordinates"),
    "edge": SceneTask("texture_edges", TaskKind.EDGES, 1, "image (texture and object) edges"),
    "occlusion_edges": SceneTask("occlusion_edges", TaskKind.EDGES, 1, "depth discontinuities"),
    "texture_edges": SceneTask("texture_edges", TaskKind.EDGES, 1, "texture cell and object boundaries"),
    "reshading": SceneTask("reshading", TaskKind.RECONSTRUCTION, 1, "shading without texture"),
    "curvature": SceneTask("curvature", TaskKind.RECONSTRUCTION, 2, "scaled principal curvatures k1 >= k2"),
    "keypoints": SceneTask("keypoints", TaskKind.HEATMAP, 1, "visible box corners and cylinder cap centres"),
    "saliency": SceneTask("saliency", TaskKind.SALIENCY, 1, "mask of the most visible object"),
    "autoencoding": SceneTask("image", TaskKind.RECONSTRUCTION, 3, "the input image"),
}
PRESETS = {
    "nyud-like": ("semseg", "depth", "normals", "edge"),
    "pascal-like": ("semseg", "parts", "normals", "saliency", "edge"),
}
LETTERS = {
    "s": "semseg", "d": "depth", "n": "normals", "k": "keypoints", "t": "texture_edges",
    "e": "occlusion_edges", "r": "reshading", "c": "curvature", "a": "autoencoding",
}


class ScenesParams(Params):
    tasks: str | list[str] = Field(
        "nyud-like", description=f"task names, a preset ({', '.join(PRESETS)}) or letters of '{''.join(LETTERS)}'"
    )
    size: int = Field(32, ge=8, description="image side in pixels")
    train_per_task: int = Field(1000, ge=1)
    test_size: int = Field(200, ge=1, description="test images, shared by all tasks")
    styles: int = Field(1, ge=1, le=len(STYLES), description="number of rendering styles in use")
    images: Literal["shared", "disjoint"] = Field(
        "shared", description="shared: all tasks label the same images; disjoint: task t renders its own, style t"
    )
    buildings: int | None = Field(
        None, ge=1, description="shared training images from this many buildings, building b in its own variation "
        "of style b mod styles (None: image i in style i mod styles)"
    )
    size_spread: float = Field(4.0, ge=1, description="images of the largest building / of the smallest")


def resolve_tasks(tasks: str | list[str]) -> list[str]:
    """Task names from a list, a preset, a single task name or a string of MAS letters; no duplicates."""
    if isinstance(tasks, list):
        for name in tasks:
            if name not in TASKS:
                raise unknown_choice("scenes task", name, list(TASKS))
        names = list(tasks)
    elif tasks in PRESETS or tasks in TASKS:
        names = list(PRESETS.get(tasks, (tasks,)))
    elif tasks and set(tasks) <= set(LETTERS):
        names = [LETTERS[letter] for letter in tasks]
    else:
        letters = ", ".join(f"{k}={v}" for k, v in LETTERS.items())
        raise ManytaskError(
            f"scenes tasks '{tasks}' is not a preset ({', '.join(PRESETS)}), a task name ({', '.join(TASKS)}) "
            f"or a string of task letters ({letters})."
        )
    if len(set(names)) != len(names):
        raise ManytaskError(f"scenes tasks {names} name a task twice; give each task once.")
    return names


def _render(
    styles: list[int] | list[Style], seed: int, size: int, names: list[str], *keys: int | str
) -> dict[str, torch.Tensor]:
    """The image and the targets of `names` for scenes drawn with the given per-image styles."""
    targets = {"image", *(TASKS[name].target for name in names)}
    return render_scenes(sample_scenes(styles, seed, *keys), size, targets)


def building_sizes(buildings: int, total: int, spread: float, seed: int) -> np.ndarray:
    """Images per building, summing to `total` (each ≥ 1): geometric from the smallest to `spread` × the smallest,
    the sizes dealt to the buildings in a seeded random order."""
    ladder = spread ** np.linspace(0.0, 1.0, buildings)
    order = numpy_rng(seed, "scenes", "buildings", "order").permutation(buildings)
    return apportion(total, ladder[order], minimum=1)


def building_styles(buildings: int, styles: int, seed: int) -> list[Style]:
    """One look per building: building b varies style b mod `styles` by its own seeded draw."""
    bases = [STYLES[b % styles] for b in range(buildings)]
    return [
        building_style(base, numpy_rng(seed, "scenes", "buildings", b), f"{base.name}, building {b}")
        for b, base in enumerate(bases)
    ]


def _check_buildings(params: ScenesParams) -> None:
    if params.images == "disjoint":
        raise ManytaskError("scenes 'buildings' needs images: shared (every task labels each building's images).")
    if params.buildings > params.train_per_task:
        raise ManytaskError(
            f"scenes has {params.buildings} buildings but only {params.train_per_task} training images; "
            "each building needs at least one, so raise train_per_task or lower buildings."
        )


def _task(name: str, train: dict[str, torch.Tensor], test: dict[str, torch.Tensor], description: str) -> Task:
    spec = TASKS[name]
    return dense_task(
        name, spec.kind, train["image"], train[spec.target], test["image"], test[spec.target], spec.num_outputs,
        description=f"{name}: {spec.description}; {description}",
    )


@register_benchmark("scenes", ScenesParams, "procedural dense tasks (segmentation, depth, normals, edges, ...)")
def scenes(params: ScenesParams, seed: int) -> Benchmark:
    """Render the train and test scenes and label them for every task; deterministic in `seed`."""
    names = resolve_tasks(params.tasks)
    if params.buildings is not None:
        _check_buildings(params)
    styles = range(params.styles)
    test_styles = [i % params.styles for i in range(params.test_size)]
    test = _render(test_styles, seed, params.size, names, "test")
    metadata: dict = {
        "task_kinds": {name: TASKS[name].kind.value for name in names},
        "styles": [STYLES[s].name for s in styles],
        "test_styles": torch.tensor(test_styles),
    }
    if params.buildings is not None:
        tasks = _building_tasks(params, seed, names, test, metadata)
    elif params.images == "shared":
        train_styles = [i % params.styles for i in range(params.train_per_task)]
        train = _render(train_styles, seed, params.size, names, "train")
        how = f"shared images, style of image i = i mod {params.styles}"
        tasks = {name: _task(name, train, test, how) for name in names}
        metadata["train_styles"] = torch.tensor(train_styles)
    else:
        task_styles = {name: t % params.styles for t, name in enumerate(names)}
        tasks = {
            name: _task(name, _render([s] * params.train_per_task, seed, params.size, [name], "train", name), test,
                        f"own images in style {s}")
            for name, s in task_styles.items()
        }
        metadata["task_styles"] = task_styles
    origin = "" if params.buildings is None else f" from {params.buildings} buildings"
    description = (
        f"{len(names)} dense tasks ({', '.join(names)}) on {params.size}x{params.size} ray-cast scenes, "
        f"{params.images} training images{origin}, {params.styles} style(s)"
    )
    return Benchmark("scenes", tasks, description, metadata)


def _building_tasks(
    params: ScenesParams, seed: int, names: list[str], test: dict[str, torch.Tensor], metadata: dict
) -> dict[str, Task]:
    """Tasks on shared training images from `params.buildings` buildings, each building's images contiguous;
    records every image's building (`sample_groups` of each task) and the buildings in `metadata`."""
    sizes = building_sizes(params.buildings, params.train_per_task, params.size_spread, seed)
    looks = building_styles(params.buildings, params.styles, seed)
    groups = np.repeat(np.arange(params.buildings), sizes)
    train = _render([looks[b] for b in groups], seed, params.size, names, "train", "buildings")
    how = f"shared images of {params.buildings} buildings, building b a variation of style b mod {params.styles}"
    tasks = {name: _task(name, train, test, how) for name in names}
    for task in tasks.values():
        task.metadata["sample_groups"] = groups
    metadata["buildings"] = [
        {"images": int(n), "style": STYLES[b % params.styles].name} for b, n in enumerate(sizes)
    ]
    metadata["train_styles"] = torch.from_numpy(groups % params.styles)
    return tasks
