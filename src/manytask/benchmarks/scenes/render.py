"""The dense targets of the `scenes` benchmark, rendered from the surfaces `geometry.cast` finds: the image
(albedo × Lambertian shading), semantic classes and parts, depth, normals in camera coordinates, occlusion and
texture edges, reshading, principal curvature, keypoint heatmaps and saliency. Every target follows in closed form
from the geometry, so labels are exact and free, and tasks can be added without a dataset; the conventions are
those of `geometry.py`.
"""

from __future__ import annotations

from collections.abc import Collection

import torch
from torch import Tensor

from manytask.benchmarks.scenes.geometry import (
    BOX,
    CYLINDER,
    EPS,
    MAX_OBJECTS,
    PLANES,
    TEXTURE_CHECKER,
    TEXTURE_PLAIN,
    Look,
    Objects,
    Scene,
    cast,
    dot,
    focal,
    pixel_directions,
    rotate_y,
    to_camera,
    to_world,
)

CURVATURE_SCALE = 0.2  # curvature targets are principal curvatures (1/world unit) × this: radius 0.2 gives 1.0
EDGE_THRESHOLD = 0.1  # occlusion edges need a depth jump of > 10 % of the nearer depth (see occlusion_edges)
KEYPOINT_SIGMA = 1.0  # pixels
KEYPOINT_TOLERANCE = 0.01  # a keypoint is visible when nothing is hit before (1 − this) × its depth
CHUNK = 256  # images rendered at once: bounds memory (a few hundred MB at 64x64)
TARGETS = (
    "image", "semseg", "parts", "depth", "normals", "occlusion_edges", "texture_edges",
    "reshading", "curvature", "keypoints", "saliency",
)


def render(scene: Scene, size: int) -> dict[str, Tensor]:
    """All TARGETS of the scene's images at size×size (see the module docstring for conventions)."""
    n, look = len(scene), scene.look
    s = cast(scene, to_world(scene.camera, pixel_directions(size, scene.camera.fov_deg)))
    hit = torch.isfinite(s.t)
    depth = torch.where(hit, s.t, 0.0)
    normal = torch.where(hit[..., None], s.normal, 0.0)
    shading = look.ambient[:, None] + (1 - look.ambient[:, None]) * dot(normal, look.light[:, None]).clamp(min=0)
    shading = torch.where(hit, shading, 0.0)
    cells, parity = texture_cells(s.uv, look)
    albedo = s.colour * (1 - look.contrast[:, None, None] * parity[..., None])
    image = (albedo * shading[..., None]).clamp(0, 1)

    def grid(v: Tensor) -> Tensor:  # (N, P, C) -> (N, C, H, W)
        return v.reshape(n, size, size, -1).permute(0, 3, 1, 2).contiguous()

    labels = torch.cat([s.surface[..., None], cells], -1).reshape(n, size, size, 3)
    surface, reach = s.surface.reshape(n, size, size), s.reach.reshape(n, -1, size, size)
    return {
        "image": grid(image),
        "semseg": s.semantic.reshape(n, size, size),
        "parts": s.part.reshape(n, size, size),
        "depth": grid(depth[..., None]),
        "normals": grid(to_camera(scene.camera, normal)),
        "occlusion_edges": occlusion_edges(s.t.reshape(n, size, size), surface, reach)[:, None].float(),
        "texture_edges": label_edges(labels)[:, None].float(),
        "reshading": grid(shading[..., None]),
        "curvature": grid(torch.where(hit[..., None], s.curvature, 0.0) * CURVATURE_SCALE),
        "keypoints": keypoint_heatmap(scene, size)[:, None],
        "saliency": salient_object(surface)[:, None].float(),
    }


def texture_cells(uv: Tensor, look: Look) -> tuple[Tensor, Tensor]:
    """Texture cell indices (N, R, 2) (unused axes 0: plain has none, stripes only u) and odd-cell parity (N, R)."""
    cells = torch.floor(uv * look.frequency[:, None, None]).long()
    kind = look.texture[:, None]
    used = torch.stack([kind != TEXTURE_PLAIN, kind == TEXTURE_CHECKER], -1)
    cells = torch.where(used, cells, 0)
    return cells, cells.sum(-1).remainder(2).to(uv.dtype)


def _boundary_pixels(horizontal: Tensor, vertical: Tensor, right: Tensor | None = None,
                     lower: Tensor | None = None) -> Tensor:
    """One pixel per flagged 4-neighbour pair, so a boundary is one pixel wide (as in NYUD's, BSDS's and PASCAL's
    edge maps): the left one of a horizontal pair (N, H, W−1) and the upper one of a vertical pair (N, H−1, W),
    or the right / lower one where `right` / `lower` (same shapes) say so."""
    n, h, w = horizontal.shape[0], vertical.shape[1] + 1, horizontal.shape[2] + 1
    right = torch.zeros_like(horizontal) if right is None else right
    lower = torch.zeros_like(vertical) if lower is None else lower
    out = torch.zeros((n, h, w), dtype=torch.bool)
    out[:, :, :-1] |= horizontal & ~right
    out[:, :, 1:] |= horizontal & right
    out[:, :-1, :] |= vertical & ~lower
    out[:, 1:, :] |= vertical & lower
    return out


def label_edges(labels: Tensor) -> Tensor:
    """(N, H, W) bool: the boundaries between regions of different label vectors (N, H, W, C), one pixel wide
    (`_boundary_pixels`: the left or upper pixel of every differing 4-neighbour pair)."""
    horizontal = (labels[:, :, 1:] != labels[:, :, :-1]).any(-1)
    vertical = (labels[:, 1:] != labels[:, :-1]).any(-1)
    return _boundary_pixels(horizontal, vertical)


def occlusion_edges(t: Tensor, surface: Tensor, reach: Tensor) -> Tensor:
    """(N, H, W) bool: the occluding pixel (the nearer) of every 4-neighbour pair such that the two see different
    surfaces, the farther one's ray misses the nearer one's surface (a silhouette, not a crease where surfaces meet,
    like floor and wall), and their depths differ by more than EDGE_THRESHOLD of the nearer. Slanted planes,
    however steep in depth, give none.

    t (N, H, W): depth, inf where nothing is hit; surface (N, H, W) ids; reach (N, S, H, W): every surface's ray
    parameter per pixel (inf: missed)."""
    horizontal = _silhouette(t[:, :, 1:], t[:, :, :-1], surface[:, :, 1:], surface[:, :, :-1], reach[..., 1:],
                             reach[..., :-1])
    vertical = _silhouette(t[:, 1:], t[:, :-1], surface[:, 1:], surface[:, :-1], reach[:, :, 1:], reach[:, :, :-1])
    return _boundary_pixels(horizontal, vertical, t[:, :, 1:] < t[:, :, :-1], t[:, 1:] < t[:, :-1])


def _silhouette(ta: Tensor, tb: Tensor, sa: Tensor, sb: Tensor, ra: Tensor, rb: Tensor) -> Tensor:
    """The occlusion-edge test of `occlusion_edges` for aligned pixel pairs a, b."""

    def sees(reach: Tensor, s: Tensor) -> Tensor:
        return torch.isfinite(reach.gather(1, s.clamp(min=0)[:, None]).squeeze(1))

    far_sees_near = torch.where(ta < tb, sees(rb, sa), sees(ra, sb))
    jump = (ta - tb).abs() > EDGE_THRESHOLD * torch.minimum(ta, tb)
    return (sa != sb) & ~far_sees_near & jump


def salient_object(surface: Tensor) -> Tensor:
    """(N, H, W) bool mask of the object with the most visible pixels (lowest slot on ties; empty with no object)."""
    slots = PLANES + torch.arange(MAX_OBJECTS)
    counts = (surface.flatten(1)[..., None] == slots).sum(1)
    best = counts.argmax(1)
    return (surface == (PLANES + best)[:, None, None]) & (counts.amax(1) > 0)[:, None, None]


_CORNERS = torch.tensor([[x, y, z] for x in (-1.0, 1.0) for y in (-1.0, 1.0) for z in (-1.0, 1.0)])


def keypoints(objects: Objects, n: int) -> tuple[Tensor, Tensor]:
    """World keypoints (N, 8·MAX_OBJECTS, 3) and validity: the 8 corners of each box, the top-cap centre of each
    cylinder (spheres have none); rows 8s..8s+7 belong to slot s."""
    corners = rotate_y(_CORNERS * objects.size[:, None], objects.yaw[:, None]) + objects.center[:, None]
    cap = objects.center + objects.size[:, 1, None] * torch.tensor([0.0, 1.0, 0.0])
    is_cyl = (objects.kind == CYLINDER)[:, None]
    first = torch.arange(8) == 0
    points = torch.where((is_cyl & first)[..., None], cap[:, None], corners)
    valid = ((objects.kind == BOX)[:, None] | (is_cyl & first))
    out = torch.zeros((n, MAX_OBJECTS, 8, 3))
    out_valid = torch.zeros((n, MAX_OBJECTS, 8), dtype=torch.bool)
    out[objects.image, objects.slot] = points
    out_valid[objects.image, objects.slot] = valid
    return out.reshape(n, -1, 3), out_valid.reshape(n, -1)


def keypoint_heatmap(scene: Scene, size: int) -> Tensor:
    """(N, H, W) max of unit-peak Gaussians (KEYPOINT_SIGMA px) at the projections of visible keypoints.

    A keypoint is visible when it is in front of the camera, projects inside the image, and the ray cast through
    its exact projection hits nothing before (1 − KEYPOINT_TOLERANCE) × its depth: a z-buffer test at sub-pixel
    position, so a corner hidden by its own box is rejected however thin the box is in the image."""
    points, valid = keypoints(scene.objects, len(scene))
    rel = points - scene.camera.eye[:, None]
    cam = to_camera(scene.camera, rel)
    z = cam[..., 2]
    valid = valid & (z > EPS)
    z = torch.where(valid, z, 1.0)
    f = focal(size, scene.camera.fov_deg)
    col = f * cam[..., 0] / z + size / 2 - 0.5
    row = -f * cam[..., 1] / z + size / 2 - 0.5
    inside = (col >= -0.5) & (col < size - 0.5) & (row >= -0.5) & (row < size - 0.5)
    seen = cast(scene, rel / z[..., None]).t
    visible = valid & inside & (seen >= z * (1 - KEYPOINT_TOLERANCE))
    pixels = torch.arange(size, dtype=torch.float32)
    gx = torch.exp(-((pixels - col[..., None]) ** 2) / (2 * KEYPOINT_SIGMA**2))
    gy = torch.exp(-((pixels - row[..., None]) ** 2) / (2 * KEYPOINT_SIGMA**2))
    return (gy[..., :, None] * (gx * visible[..., None])[..., None, :]).amax(1)


def render_scenes(scene: Scene, size: int, targets: Collection[str] = TARGETS) -> dict[str, Tensor]:
    """Render `targets` of all images in chunks of CHUNK images (bounded memory); same scene, same bytes."""
    out: dict[str, Tensor] = {}
    for start in range(0, len(scene), CHUNK):
        stop = min(start + CHUNK, len(scene))
        part = render(scene.chunk(start, stop), size)
        for name in targets:
            if name not in out:
                out[name] = part[name].new_empty((len(scene), *part[name].shape[1:]))
            out[name][start:stop] = part[name]
    return out
