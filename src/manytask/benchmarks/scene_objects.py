"""`scene-objects`: a ~100-class image classification benchmark rendered offline, a stand-in for CIFAR-100 with
disjoint held-out classes as the pretraining source (FL + TaLoS, shared/specs/talos_fl.md).

A class is the look of ONE target object in a ray-cast scene (the `scenes` caster): its *form* × its *colour*.
Forms are a kind with proportions (sphere: ball, dome, bead; box: cube, pillar, slab; cylinder: drum, column,
disc) and colours come from a fixed table of 16 (12 hues, white, grey, black, brown), so the grid has 9 × 16 = 144
classes, named like "teal pillar". A fixed permutation of the grid (the same for every seed, so a class set is one
benchmark, as CIFAR-100 is) gives the first `classes` combinations to the task and the next `source_classes` to
the pretraining source: the two sets are disjoint but share forms and colours, which is what lets a backbone
pretrained on the source transfer.

The target rule: the target always stands in the front-centre floor cell, so it is the object in the middle of the
view (a little below the centre) with nothing in front of it; 0 to 3 distractors of random forms and colours (any
combination, task or source) stand in distinct other cells: behind it in the back row or beside it at the sides.
Nuisances per image: the camera of a random `scenes` style (height, pitch, yaw within its ranges), the
target's position in its cell, its turn about the vertical, a ±10 % scale, the distractors, a random direction of
the light (from the camera's side) and ambient level, the floor and wall colours (a style's, jittered), the surface
pattern of every surface in the image (plain, stripes or checker, with random frequency and contrast; the caster
textures whole images, so the pattern is a nuisance, not a class attribute) and colour jitter of every object.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from pydantic import Field
from torch import Tensor

from manytask.benchmarks.base import Benchmark
from manytask.benchmarks.registry import register_benchmark
from manytask.benchmarks.scenes.geometry import BOX, CYLINDER, MAX_OBJECTS, SPHERE, Look, Scene
from manytask.benchmarks.scenes.render import render_scenes
from manytask.benchmarks.scenes.styles import (
    CELL,
    COLOUR_JITTER,
    GRID,
    STYLES,
    TEXTURES,
    cameras,
    footprints,
    place_objects,
)
from manytask.errors import ManytaskError
from manytask.registry import Params
from manytask.seeding import numpy_rng
from manytask.tasks.task import Task, classification_task


@dataclass(frozen=True)
class Form:
    """A kind with proportions: half-extents as in `geometry.Objects`; lift 1 rests it on the floor, 0 sinks it to
    its centre (a sphere becomes a dome). Footprints stay within MAX_FOOTPRINT at the largest scale."""

    name: str
    kind: int
    size: tuple[float, float, float]
    lift: float = 1.0


FORMS = (
    Form("ball", SPHERE, (0.3, 0.3, 0.3)),
    Form("dome", SPHERE, (0.36, 0.36, 0.36), lift=0.0),
    Form("bead", SPHERE, (0.17, 0.17, 0.17)),
    Form("cube", BOX, (0.24, 0.24, 0.24)),
    Form("pillar", BOX, (0.14, 0.4, 0.14)),
    Form("slab", BOX, (0.3, 0.09, 0.22)),
    Form("drum", CYLINDER, (0.27, 0.27, 0.27)),
    Form("column", CYLINDER, (0.14, 0.42, 0.14)),
    Form("disc", CYLINDER, (0.36, 0.07, 0.36)),
)
COLOURS = {
    "red": (0.85, 0.15, 0.15), "orange": (0.95, 0.5, 0.1), "yellow": (0.95, 0.85, 0.15),
    "lime": (0.6, 0.9, 0.15), "green": (0.15, 0.65, 0.2), "teal": (0.1, 0.55, 0.5),
    "cyan": (0.25, 0.85, 0.9), "azure": (0.2, 0.5, 0.95), "blue": (0.15, 0.2, 0.8),
    "violet": (0.5, 0.2, 0.85), "magenta": (0.85, 0.2, 0.75), "pink": (0.95, 0.6, 0.7),
    "white": (0.92, 0.92, 0.92), "grey": (0.5, 0.5, 0.5), "black": (0.1, 0.1, 0.1), "brown": (0.5, 0.3, 0.12),
}
GRID_SIZE = len(FORMS) * len(COLOURS)
PALETTE = np.array(list(COLOURS.values()))
TARGET_CELL = 1  # GRID[1] = (0, 0.45): the front-centre cell
SCALE_JITTER = 0.1
PLANE_JITTER = 0.15
MAX_DISTRACTORS = MAX_OBJECTS - 1


class SceneObjectsParams(Params):
    classes: int = Field(100, ge=1, description=f"task classes, drawn from the {GRID_SIZE} form x colour combinations")
    source_classes: int = Field(28, ge=0, description="held-out classes of the pretraining source (0: no source)")
    train_per_class: int = Field(200, ge=1, description="training images per task class")
    test_per_class: int = Field(50, ge=1, description="test images per class (task and source)")
    source_per_class: int = Field(200, ge=1, description="training images per source class")
    size: int = Field(32, ge=8, description="image side in pixels")


def class_name(combination: int) -> str:
    """'colour form' of a grid combination (form-major order)."""
    form, colour = divmod(combination, len(COLOURS))
    return f"{list(COLOURS)[colour]} {FORMS[form].name}"


def split_classes(classes: int, source_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """Grid combinations of the task and of the source: consecutive runs of one fixed permutation, so disjoint."""
    if classes + source_classes > GRID_SIZE:
        raise ManytaskError(
            f"scene-objects has {GRID_SIZE} form x colour classes, fewer than the {classes} task + {source_classes} "
            f"source classes asked for; lower classes or source_classes."
        )
    order = numpy_rng(0, "scene-objects", "classes").permutation(GRID_SIZE)
    return order[:classes], order[classes:classes + source_classes]


def sample_object_scenes(combinations: np.ndarray, seed: int, *keys: int | str) -> Scene:
    """Scene i shows grid combination combinations[i] as its target (slot 0) among random distractors.

    Every quantity has its own generator and is drawn for all images at once, as in `scenes.styles.sample_scenes`."""
    n = len(combinations)

    def uniform(name: str, *shape: int) -> np.ndarray:
        return numpy_rng(seed, "scene-objects", *keys, name).random((n, *shape))

    def integers(name: str, high: int, *shape: int) -> np.ndarray:
        return numpy_rng(seed, "scene-objects", *keys, name).integers(high, size=(n, *shape))

    distractors = integers("distractor", GRID_SIZE, MAX_DISTRACTORS)  # random forms and colours, any class's
    form, colour = np.divmod(np.concatenate([combinations[:, None], distractors], 1), len(COLOURS))
    kind = np.array([f.kind for f in FORMS])[form]
    size = np.array([f.size for f in FORMS])[form] * (1 + SCALE_JITTER * (2 * uniform("scale", MAX_OBJECTS, 1) - 1))
    centre = _centres(kind, size, np.array([f.lift for f in FORMS])[form], uniform("cell", len(GRID) - 1),
                      uniform("offset", MAX_OBJECTS, 2))
    jitter = (2 * uniform("colour", MAX_OBJECTS, 3) - 1) * COLOUR_JITTER
    count = 1 + integers("distractors", MAX_DISTRACTORS + 1)
    yaw = uniform("yaw", MAX_OBJECTS) * 2 * np.pi
    objects = place_objects(count, kind, centre, size, yaw, np.clip(PALETTE[colour] + jitter, 0, 1))
    chosen = [STYLES[s] for s in integers("style", len(STYLES))]
    planes = np.array([s.palette[:2] for s in chosen]) + (2 * uniform("planes", 2, 3) - 1) * PLANE_JITTER
    return Scene(cameras(chosen, uniform("camera", 3)), objects, _look(np.clip(planes, 0, 1), uniform("look", 6)))


def _centres(kind: np.ndarray, size: np.ndarray, lift: np.ndarray, cell_u: np.ndarray, offset_u: np.ndarray
             ) -> np.ndarray:
    """Object centres (n, MAX_OBJECTS, 3): slot 0 in the front-centre cell, the others in distinct other cells,
    each jittered inside its cell as far as its footprint allows (so objects never intersect)."""
    others = np.delete(np.arange(len(GRID)), TARGET_CELL)
    cells = np.concatenate([np.full((len(size), 1), TARGET_CELL), others[cell_u.argsort(1)[:, :MAX_DISTRACTORS]]], 1)
    offset = (2 * offset_u - 1) * (CELL / 2 - footprints(kind, size))[..., None]
    floor = GRID[cells] + offset
    return np.stack([floor[..., 0], lift * size[..., 1], floor[..., 1]], -1)


def _look(planes: np.ndarray, u: np.ndarray) -> Look:
    """Per-image surface pattern (kind, frequency 1-3, contrast 0.15-0.5), light from the camera's side (azimuth
    within ±81°, elevation 20°-80°) and ambient 0.15-0.45, from uniforms u (n, 6)."""
    azimuth, elevation = (2 * u[:, 3] - 1) * 0.45 * np.pi, np.radians(20 + 60 * u[:, 4])
    light = np.stack([np.sin(azimuth) * np.cos(elevation), np.sin(elevation), -np.cos(azimuth) * np.cos(elevation)], 1)
    texture = np.floor(u[:, 0] * len(TEXTURES)).astype(np.int64)
    floats = (planes, 1 + 2 * u[:, 1], 0.15 + 0.35 * u[:, 2], light, 0.15 + 0.3 * u[:, 5])
    planes_t, frequency, contrast, light_t, ambient = (torch.tensor(a, dtype=torch.float32) for a in floats)
    return Look(planes_t, torch.from_numpy(texture), frequency, contrast, light_t, ambient)


def render_split(combinations: np.ndarray, per_class: int, seed: int, size: int, key: str) -> tuple[Tensor, Tensor]:
    """`per_class` images of each class (label i shows combinations[i]), interleaved: image j has label j mod C."""
    labels = np.arange(per_class * len(combinations)) % len(combinations)
    images = render_scenes(sample_object_scenes(combinations[labels], seed, key), size, {"image"})["image"]
    return images, torch.from_numpy(labels)


def _task(name: str, combinations: np.ndarray, train_per_class: int, params: SceneObjectsParams, seed: int) -> Task:
    """A classification task over `combinations`; train and test images come from their own keys."""
    train = render_split(combinations, train_per_class, seed, params.size, f"{name}-train")
    test = render_split(combinations, params.test_per_class, seed, params.size, f"{name}-test")
    examples = ", ".join(class_name(c) for c in combinations[:3])
    description = f"{len(combinations)} form x colour classes of the front object ({examples}, ...)"
    return classification_task(name, *train, *test, num_classes=len(combinations), description=description)


@register_benchmark("scene-objects", SceneObjectsParams,
                    "ray-cast objects, ~100 form x colour classes with held-out source classes (CIFAR-100 stand-in)")
def scene_objects(params: SceneObjectsParams, seed: int) -> Benchmark:
    """The task `objects` and, with source_classes > 0, the pretraining source `source`; deterministic in `seed`."""
    task_classes, source_classes = split_classes(params.classes, params.source_classes)
    source = None
    if len(source_classes):
        source = _task("source", source_classes, params.source_per_class, params, seed)
    description = (
        f"{params.classes} classes of the front object's form x colour in {params.size}x{params.size} ray-cast "
        f"scenes with distractors, {params.source_classes} disjoint source classes for pretraining"
    )
    metadata = {"class_names": [class_name(c) for c in task_classes],
                "source_class_names": [class_name(c) for c in source_classes]}
    task = _task("objects", task_classes, params.train_per_class, params, seed)
    return Benchmark("scene-objects", {"objects": task}, description, metadata, pretraining=source)
