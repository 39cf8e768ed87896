"""Styles of the `scenes` benchmark: each is one input distribution (colours, texture, light, camera, objects).

Styles exist so that clients can see visibly different image distributions while the geometry targets keep
their meaning: a style changes how a scene looks and which scenes are likely, never what a label means.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from manytask.benchmarks.scenes.geometry import (
    BOX,
    CYLINDER,
    MAX_OBJECTS,
    SPHERE,
    Camera,
    Look,
    Objects,
    Scene,
    look_at,
)
from manytask.errors import ManytaskError
from manytask.seeding import numpy_rng

Colour = tuple[float, float, float]
TEXTURES = ("plain", "stripes", "checker")


@dataclass(frozen=True)
class Style:
    """One look of the scenes.

    palette: base albedo per semantic class (floor, wall, sphere, box, cylinder); each object jitters its class colour.
    texture: "plain", "stripes" (cells along the surface's u coordinate) or "checker" (cells along u and v);
    frequency: texture cells per world unit (cells of 1.7 to 5 units: at the default 32×32 a texture-edge map is
    10–14 % positive in every style, as real edge maps are 5–15 %); contrast: albedo of odd cells is
    (1 - contrast) × the colour.
    light: direction towards the directional light (world coordinates, normalized when rendering); ambient: the
    shading floor, shading = ambient + (1 - ambient)·max(0, n·l).
    camera_height (world units) and pitch_deg (downward tilt) place the camera looking at the scene centre.
    mix: probabilities of sphere, box, cylinder; count: inclusive range of objects per scene (within 1..4).
    """

    name: str
    palette: tuple[Colour, Colour, Colour, Colour, Colour]
    texture: str
    frequency: float
    contrast: float
    light: tuple[float, float, float]
    ambient: float
    camera_height: float
    pitch_deg: float
    mix: tuple[float, float, float]
    count: tuple[int, int]

    @property
    def texture_id(self) -> int:
        return TEXTURES.index(self.texture)


STYLES: tuple[Style, ...] = (
    Style(
        name="studio",
        palette=((0.75, 0.7, 0.62), (0.55, 0.6, 0.7), (0.85, 0.3, 0.25), (0.3, 0.65, 0.35), (0.3, 0.4, 0.85)),
        texture="checker", frequency=0.4, contrast=0.3, light=(-0.5, 1.0, -0.6), ambient=0.3,
        camera_height=1.6, pitch_deg=35.0, mix=(1 / 3, 1 / 3, 1 / 3), count=(1, 4),
    ),
    Style(
        name="low-stripes",
        palette=((0.35, 0.4, 0.45), (0.8, 0.8, 0.75), (0.95, 0.75, 0.2), (0.65, 0.3, 0.7), (0.2, 0.75, 0.75)),
        texture="stripes", frequency=0.3, contrast=0.45, light=(0.8, 0.7, -0.3), ambient=0.25,
        camera_height=0.95, pitch_deg=18.0, mix=(0.6, 0.2, 0.2), count=(2, 4),
    ),
    Style(
        name="top-down",
        palette=((0.9, 0.88, 0.85), (0.9, 0.75, 0.75), (0.55, 0.75, 0.95), (0.95, 0.6, 0.4), (0.6, 0.85, 0.55)),
        texture="checker", frequency=0.3, contrast=0.2, light=(0.1, 1.0, 0.1), ambient=0.4,
        camera_height=2.4, pitch_deg=55.0, mix=(0.2, 0.6, 0.2), count=(1, 3),
    ),
    Style(
        name="dusk-plain",
        palette=((0.25, 0.2, 0.3), (0.15, 0.15, 0.25), (0.95, 0.95, 0.9), (0.9, 0.45, 0.1), (0.75, 0.1, 0.35)),
        texture="plain", frequency=0.2, contrast=0.0, light=(-0.9, 0.35, 0.2), ambient=0.15,
        camera_height=1.3, pitch_deg=28.0, mix=(0.2, 0.2, 0.6), count=(3, 4),
    ),
    Style(
        name="fine-stripes",
        palette=((0.6, 0.5, 0.4), (0.45, 0.35, 0.3), (0.4, 0.9, 0.4), (0.9, 0.9, 0.3), (0.95, 0.5, 0.7)),
        texture="stripes", frequency=0.6, contrast=0.5, light=(0.3, 0.8, -0.8), ambient=0.3,
        camera_height=1.9, pitch_deg=42.0, mix=(1 / 3, 1 / 3, 1 / 3), count=(1, 4),
    ),
)


def style(index: int) -> Style:
    """Style number `index` (0-based)."""
    if not 0 <= index < len(STYLES):
        raise ManytaskError(f"scenes style {index} does not exist; valid styles are 0 to {len(STYLES) - 1}.")
    return STYLES[index]


# A building's variation of its base style: a tint of every class colour plus a smaller shift of each, the light
# turned, the camera raised or lowered and tilted, and the texture cells scaled; each uniform within these bounds.
BUILDING_TINT = 0.1
BUILDING_CLASS_SHIFT = 0.05
BUILDING_LIGHT_JITTER = 0.3  # added to each component of the unit light direction
MIN_LIGHT_UP = 0.2  # the varied light still comes from above
BUILDING_HEIGHT_JITTER = 0.15  # relative
BUILDING_PITCH_JITTER = 5.0  # degrees
BUILDING_FREQUENCY_RATIO = 1.5  # texture frequency × [1/1.5, 1.5], log-uniform


def building_style(base: Style, rng: np.random.Generator, name: str) -> Style:
    """`base` as one building sees it: a new look with the same texture kind, object mix and count.

    The changes alter only how a scene looks (colours, light, viewpoint, texture scale), never what a label
    means; `rng` draws them, `name` names the new style."""
    shift = rng.uniform(-1, 1, 3) * BUILDING_TINT + rng.uniform(-1, 1, (5, 3)) * BUILDING_CLASS_SHIFT
    palette = np.clip(np.array(base.palette) + shift, 0.05, 0.95)
    light = np.array(base.light) / np.linalg.norm(base.light) + rng.uniform(-1, 1, 3) * BUILDING_LIGHT_JITTER
    light[1] = max(light[1], MIN_LIGHT_UP)
    height, pitch, frequency = rng.uniform(-1, 1, 3)
    return replace(
        base,
        name=name,
        palette=tuple(tuple(colour) for colour in palette.tolist()),
        light=tuple(light.tolist()),
        camera_height=base.camera_height * (1 + height * BUILDING_HEIGHT_JITTER),
        pitch_deg=base.pitch_deg + pitch * BUILDING_PITCH_JITTER,
        frequency=base.frequency * BUILDING_FREQUENCY_RATIO**frequency,
    )


# Layout: objects stand in distinct cells of a 3×2 grid on the floor, so they never intersect; each fits a circle of
# radius MAX_FOOTPRINT, jittered inside its cell. The camera looks at TARGET from its style's height and pitch.
CELL = 0.9
GRID = np.array([(x, z) for z in (0.45, 1.35) for x in (-CELL, 0.0, CELL)])
MAX_FOOTPRINT = 0.42
TARGET = (0.0, 0.25, 0.9)
CAMERA_YAW = 0.2  # radians of random camera turn about the scene centre, each side
COLOUR_JITTER = 0.08


def sample_scenes(styles: Sequence[int | Style], seed: int, *keys: int | str) -> Scene:
    """Random scenes, image i drawn from styles[i] (a `Style` or the index of one of STYLES); deterministic in
    (seed, keys, styles).

    Every random quantity has its own generator and is drawn for all images at once, so image i depends only on
    its style and index (a longer list keeps the first images unchanged)."""
    chosen = [s if isinstance(s, Style) else style(s) for s in styles]
    n = len(chosen)

    def uniform(name: str, *shape: int) -> np.ndarray:
        return numpy_rng(seed, "scenes", *keys, name).random((n, *shape))

    lo, hi = np.array([s.count for s in chosen]).T
    count = lo + np.floor(uniform("count") * (hi - lo + 1)).astype(int)
    mix = np.cumsum([s.mix for s in chosen], axis=1)
    kind = (uniform("kind", MAX_OBJECTS)[..., None] > mix[:, None, :2]).sum(-1)
    size = _sizes(kind, uniform("size", MAX_OBJECTS, 3))
    footprint = footprints(kind, size)
    cells = GRID[uniform("cell", len(GRID)).argsort(axis=1)[:, :MAX_OBJECTS]]
    offset = (uniform("offset", MAX_OBJECTS, 2) * 2 - 1) * (CELL / 2 - footprint)[..., None]
    center = np.stack([cells[..., 0] + offset[..., 0], size[..., 1], cells[..., 1] + offset[..., 1]], -1)
    palette = np.array([s.palette for s in chosen])
    jitter = (uniform("colour", MAX_OBJECTS + 2, 3) * 2 - 1) * COLOUR_JITTER
    colour = np.clip(np.take_along_axis(palette, 2 + kind[..., None], 1) + jitter[:, 2:], 0, 1)
    objects = place_objects(count, kind, center, size, uniform("yaw", MAX_OBJECTS) * 2 * np.pi, colour)
    plane_colours = np.clip(palette[:, :2] + jitter[:, :2], 0, 1)
    return Scene(cameras(chosen, uniform("camera", 3)), objects, _look(chosen, plane_colours))


def place_objects(
    count: np.ndarray, kind: np.ndarray, center: np.ndarray, size: np.ndarray, yaw: np.ndarray, colour: np.ndarray
) -> Objects:
    """The flat `Objects` table of per-slot arrays (n, MAX_OBJECTS, ...): image i keeps its first count[i] slots.

    Other scene builders lay out their objects as dense slot arrays too, so they share this packing."""
    image, slot = np.nonzero(np.arange(MAX_OBJECTS) < count[:, None])
    return Objects(
        *(torch.from_numpy(a) for a in (image, slot, kind[image, slot])),
        *(torch.tensor(a[image, slot], dtype=torch.float32) for a in (center, size, yaw, colour)),
    )


def footprints(kind: np.ndarray, size: np.ndarray) -> np.ndarray:
    """Radius about the centre, on the floor, that an object covers at any yaw (boxes: their half-diagonal)."""
    return np.where(kind == BOX, np.hypot(size[..., 0], size[..., 2]), size[..., 0])


def _sizes(kind: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Local half-extents (n, MAX_OBJECTS, 3) from uniforms u: every footprint fits MAX_FOOTPRINT."""
    sphere = np.repeat(0.22 + 0.2 * u[..., :1], 3, axis=-1)
    box = np.array([0.15, 0.15, 0.15]) + u * np.array([0.13, 0.25, 0.13])
    radius, half_height = 0.15 + 0.27 * u[..., 0], 0.18 + 0.32 * u[..., 1]
    cylinder = np.stack([radius, half_height, radius], -1)
    return np.select([kind[..., None] == k for k in (SPHERE, BOX, CYLINDER)], [sphere, box, cylinder])


def cameras(chosen: Sequence[Style], u: np.ndarray) -> Camera:
    """Cameras at the style's height (±10 %) and pitch (±3°), turned up to CAMERA_YAW about the scene centre."""
    height = np.array([s.camera_height for s in chosen]) * (0.9 + 0.2 * u[:, 0])
    pitch = np.radians(np.array([s.pitch_deg for s in chosen]) + (u[:, 1] * 2 - 1) * 3)
    yaw = (u[:, 2] * 2 - 1) * CAMERA_YAW
    distance = (height - TARGET[1]) / np.sin(pitch)
    forward = np.stack([np.sin(yaw) * np.cos(pitch), -np.sin(pitch), np.cos(yaw) * np.cos(pitch)], -1)
    target = np.broadcast_to(np.array(TARGET), forward.shape)
    eye = target - distance[:, None] * forward
    return look_at(torch.tensor(eye, dtype=torch.float32), torch.tensor(target, dtype=torch.float32))


def _look(chosen: Sequence[Style], plane_colours: np.ndarray) -> Look:
    light = np.array([s.light for s in chosen])
    return Look(
        torch.tensor(plane_colours, dtype=torch.float32),
        torch.tensor([s.texture_id for s in chosen], dtype=torch.int64),
        *(torch.tensor([getattr(s, k) for s in chosen], dtype=torch.float32) for k in ("frequency", "contrast")),
        torch.tensor(light / np.linalg.norm(light, axis=1, keepdims=True), dtype=torch.float32),
        torch.tensor([s.ambient for s in chosen], dtype=torch.float32),
    )
