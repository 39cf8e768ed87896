"""The scenes and the vectorized ray caster of the `scenes` benchmark: cameras, primitives (sphere, box, vertical
cylinder, floor and wall planes), their closed-form ray intersections, and `cast`, which returns the nearest
surface of every ray with its depth, normal, texture coordinates, class, part and principal curvatures.

Conventions. World: y up, the floor is the plane y = 0, the back wall is the plane z = `wall_z` facing −z, the
camera sits at z < 0 looking towards +z. Camera coordinates: x right, y up, z forward (the frame's axes satisfy
x × y = z with the ordinary cross product, like the world axes, so the camera rotation is proper). Pixel (i, j)
(row i from the top, column j from the left) sees the ray with camera direction ((j + ½ − W/2)/f, −(i + ½ − H/2)/f, 1),
f = (W/2)/tan(fov/2): with this unnormalized direction the ray parameter t *is* the camera-space depth z.

Objects are given in a local frame: centre c, half-extents `size` (sphere (r, r, r); box (a, b, c); cylinder
(r, half-height, r)) and a rotation `yaw` about the vertical axis; local = R_y(−yaw)(world − c). An object rests
on the floor when its centre's y equals its half-height. Everything is float32 on the CPU and batched over images
and pixels; the only Python loops run over the three primitive kinds and over chunks of images.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields, replace

import torch
from torch import Tensor

SPHERE, BOX, CYLINDER = 0, 1, 2
MAX_OBJECTS = 4
PLANES = 2  # surface ids: 0 floor, 1 wall, 2 + slot for the object in that slot
CLASS_NAMES = ("floor", "wall", "sphere", "box", "cylinder")
PART_NAMES = ("background", "sphere-upper", "sphere-lower", "box-top", "box-side", "cylinder-cap", "cylinder-side")
TEXTURE_PLAIN, TEXTURE_STRIPES, TEXTURE_CHECKER = 0, 1, 2
IGNORE = 255
FOV_DEG = 55.0
WALL_Z = 2.5
EPS = 1e-4  # smallest accepted ray parameter


@dataclass(frozen=True)
class Camera:
    """Pinhole cameras of N images: eye (N, 3); rotation (N, 3, 3) whose columns are the camera's x, y, z axes."""

    eye: Tensor
    rotation: Tensor
    fov_deg: float = FOV_DEG


@dataclass(frozen=True)
class Objects:
    """M objects of N images, flattened: image index and slot (< MAX_OBJECTS, unique per image) place each one."""

    image: Tensor  # (M,) int64
    slot: Tensor  # (M,) int64
    kind: Tensor  # (M,) int64: SPHERE, BOX or CYLINDER
    center: Tensor  # (M, 3)
    size: Tensor  # (M, 3) local half-extents
    yaw: Tensor  # (M,) radians
    colour: Tensor  # (M, 3) albedo in [0, 1]


@dataclass(frozen=True)
class Look:
    """Per-image appearance: floor and wall colours (N, 2, 3), texture id/frequency/contrast (N,), light (N, 3)
    (unit, towards the light) and ambient (N,) of shading = ambient + (1 − ambient)·max(0, n·l)."""

    plane_colours: Tensor
    texture: Tensor
    frequency: Tensor
    contrast: Tensor
    light: Tensor
    ambient: Tensor


@dataclass(frozen=True)
class Scene:
    camera: Camera
    objects: Objects
    look: Look
    wall_z: float = WALL_Z

    def __len__(self) -> int:
        return len(self.camera.eye)

    def chunk(self, start: int, stop: int) -> Scene:
        """Images start..stop-1 as their own scene (object image indices renumbered from 0)."""
        keep = (self.objects.image >= start) & (self.objects.image < stop)
        objects = Objects(**{f.name: getattr(self.objects, f.name)[keep] for f in fields(Objects)})
        objects = replace(objects, image=objects.image - start)
        camera = replace(self.camera, eye=self.camera.eye[start:stop], rotation=self.camera.rotation[start:stop])
        look = Look(**{f.name: getattr(self.look, f.name)[start:stop] for f in fields(Look)})
        return Scene(camera, objects, look, self.wall_z)


@dataclass(frozen=True)
class Hit:
    """Ray hits on one kind of surface: t (..., R), inf where missed; normal (..., R, 3) and uv (..., R, 2) texture
    coordinates in the surface's frame; part (..., R) int64 (PART_NAMES); curvature (..., R, 2) as k1 ≥ k2."""

    t: Tensor
    normal: Tensor
    uv: Tensor
    part: Tensor
    curvature: Tensor


def look_at(eye: Tensor, target: Tensor, fov_deg: float = FOV_DEG) -> Camera:
    """Cameras at eye (N, 3) looking at target (N, 3) with no roll (the world y axis projects upwards)."""
    forward = _unit(target - eye)
    up = torch.zeros_like(forward)
    up[:, 1] = 1.0
    right = _unit(torch.linalg.cross(up, forward))
    return Camera(eye, torch.stack([right, torch.linalg.cross(forward, right), forward], dim=2), fov_deg)


def focal(size: int, fov_deg: float) -> float:
    """Focal length in pixels of a size×size image with horizontal field of view fov_deg."""
    return size / 2 / math.tan(math.radians(fov_deg) / 2)


def pixel_directions(size: int, fov_deg: float = FOV_DEG) -> Tensor:
    """(size·size, 3) camera-space ray directions with z = 1, pixels in row-major order."""
    coords = (torch.arange(size, dtype=torch.float32) + 0.5 - size / 2) / focal(size, fov_deg)
    y, x = torch.meshgrid(-coords, coords, indexing="ij")
    return torch.stack([x, y, torch.ones_like(x)], dim=-1).reshape(-1, 3)


def to_world(camera: Camera, v: Tensor) -> Tensor:
    """Camera-space vectors (N, K, 3) or (K, 3) in world coordinates (N, K, 3)."""
    return v @ camera.rotation.mT


def to_camera(camera: Camera, v: Tensor) -> Tensor:
    """World vectors (N, K, 3) in camera coordinates."""
    return v @ camera.rotation


def rotate_y(v: Tensor, yaw: Tensor) -> Tensor:
    """v (..., 3) rotated by yaw (broadcast to v[..., 0]) about the y axis: x' = c·x + s·z, z' = −s·x + c·z."""
    c, s = torch.cos(yaw), torch.sin(yaw)
    x, y, z = v.unbind(-1)
    return torch.stack([c * x + s * z, y, c * z - s * x], dim=-1)


def _unit(v: Tensor) -> Tensor:
    return v / v.norm(dim=-1, keepdim=True)


def dot(a: Tensor, b: Tensor) -> Tensor:
    return (a * b).sum(-1)


def _safe(d: Tensor) -> Tensor:
    """Direction components bounded away from 0 (keeping the sign), so slab divisions give ±inf-like values."""
    return torch.where(d.abs() < 1e-12, torch.full_like(d, 1e-12).copysign(d), d)


def _angle_u(p: Tensor, radius: Tensor) -> Tensor:
    """Arc length around the vertical axis, from 0 to 2π·radius, seam at local +z (away from a camera looking along
    +z). Object uv start at 0 on a face's edge, not its centre: a texture cell boundary at the centre of every face
    would cross every object whatever the texture's frequency."""
    return radius * (torch.atan2(p[..., 0], -p[..., 2]) + torch.pi)


def _zeros_like_rays(t: Tensor, channels: int) -> Tensor:
    return t.new_zeros((*t.shape, channels))


def sphere_hit(o: Tensor, d: Tensor, size: Tensor) -> Hit:
    """Rays o (M, 1, 3) + t·d (M, R, 3) against spheres of radius size[:, 0] centred at the local origin."""
    r = size[:, 0, None]
    a, b, c = dot(d, d), dot(o, d), dot(o, o) - r * r
    disc = b * b - a * c
    t = (-b - disc.clamp(min=0).sqrt()) / a
    hit = (disc >= 0) & (t > EPS)
    t = torch.where(hit, t, torch.inf)
    p = o + torch.where(hit, t, 0.0)[..., None] * d
    radius = r.expand_as(t)
    uv = torch.stack([_angle_u(p, radius), p[..., 1] + radius], dim=-1)
    part = torch.where(p[..., 1] >= 0, 1, 2)
    curvature = torch.stack([1 / radius, 1 / radius], dim=-1)
    return Hit(t, p / r[..., None], uv, part, curvature)


def box_hit(o: Tensor, d: Tensor, size: Tensor) -> Hit:
    """Slab test against boxes with half-extents size (M, 3) centred at the local origin.

    The face hit is the axis whose entry slab is entered last; uv are the two in-face coordinates
    (top/bottom: x, z; ±x faces: z, y; ±z faces: x, y), from the face's corner. The top face (+y) is part 3,
    every other face part 4."""
    half, ds = size[:, None, :], _safe(d)
    t1, t2 = (-half - o) / ds, (half - o) / ds
    t_near, axis = torch.minimum(t1, t2).max(-1)
    t_far = torch.maximum(t1, t2).min(-1).values
    hit = (t_near <= t_far) & (t_near > EPS)
    t = torch.where(hit, t_near, torch.inf)
    p = o + torch.where(hit, t, 0.0)[..., None] * d
    normal = -torch.sign(ds) * torch.nn.functional.one_hot(axis, 3).to(d.dtype)
    corner = p + half  # in-face coordinates from the face's corner
    uv = torch.stack([torch.where(axis == 0, corner[..., 2], corner[..., 0]),
                      torch.where(axis == 1, corner[..., 2], corner[..., 1])], -1)
    part = torch.where(normal[..., 1] > 0, 3, 4)
    return Hit(t, normal, uv, part, _zeros_like_rays(t, 2))


def cylinder_hit(o: Tensor, d: Tensor, size: Tensor) -> Hit:
    """Vertical cylinders of radius size[:, 0] and half-height size[:, 1] centred at the local origin, with caps.

    Only the cap on the ray origin's side can be the nearest cap hit. Side uv: (arc length, height above the base);
    caps: (x, z) from the corner of the cap's bounding square."""
    r, hh = size[:, 0, None], size[:, 1, None]
    dx, dy, dz = d.unbind(-1)
    ox, oy, oz = o.unbind(-1)
    a, b, c = dx * dx + dz * dz, ox * dx + oz * dz, ox * ox + oz * oz - r * r
    disc = b * b - a * c
    t_side = (-b - disc.clamp(min=0).sqrt()) / a.clamp(min=1e-12)
    side = (disc >= 0) & (a > 1e-12) & (t_side > EPS) & ((oy + t_side * dy).abs() <= hh)
    cap_y = torch.where(oy > 0, hh, -hh)
    t_cap = (cap_y - oy) / _safe(dy)
    cap_x, cap_z = ox + t_cap * dx, oz + t_cap * dz
    cap = (t_cap > EPS) & (cap_x * cap_x + cap_z * cap_z <= r * r)
    on_cap = cap & ~(side & (t_side < t_cap))
    t = torch.where(on_cap, t_cap, torch.where(side, t_side, torch.inf))
    p = o + torch.where(torch.isfinite(t), t, 0.0)[..., None] * d
    radius = r.expand_as(t)
    side_normal = torch.stack([p[..., 0] / radius, torch.zeros_like(t), p[..., 2] / radius], -1)
    cap_normal = torch.stack([torch.zeros_like(t), torch.sign(cap_y).expand_as(t), torch.zeros_like(t)], -1)
    normal = torch.where(on_cap[..., None], cap_normal, side_normal)
    uv = torch.where(on_cap[..., None], p[..., [0, 2]] + radius[..., None],
                     torch.stack([_angle_u(p, radius), p[..., 1] + hh], -1))
    k1 = torch.where(on_cap, 0.0, 1 / radius)
    return Hit(t, normal, uv, torch.where(on_cap, 5, 6), torch.stack([k1, torch.zeros_like(k1)], -1))


def plane_hit(o: Tensor, d: Tensor, axis: int, offset: float, facing: float) -> Hit:
    """Rays o (N, 1, 3) + t·d (N, R, 3) against the plane x[axis] = offset with normal facing·e_axis (part 0).

    uv are the world coordinates along the other two axes (floor: x, z; wall: x, y)."""
    t = (offset - o[..., axis]) / _safe(d[..., axis])
    t = torch.where(t > EPS, t, torch.inf)
    p = o + torch.where(torch.isfinite(t), t, 0.0)[..., None] * d
    normal = _zeros_like_rays(t, 3)
    normal[..., axis] = facing
    uv = p[..., [k for k in range(3) if k != axis]]
    return Hit(t, normal, uv, torch.zeros_like(t, dtype=torch.int64), _zeros_like_rays(t, 2))


KERNELS: dict[int, Callable[[Tensor, Tensor, Tensor], Hit]] = {SPHERE: sphere_hit, BOX: box_hit, CYLINDER: cylinder_hit}


def candidates(scene: Scene, dirs: Tensor) -> Hit:
    """Hits of world rays dirs (N, R, 3) from each image's eye on every surface: fields (N, 2 + MAX_OBJECTS, R, ...),
    index 0 the floor, 1 the wall, 2 + s the object in slot s (t = inf for empty slots), normals in world space."""
    eye = scene.camera.eye[:, None, :]
    n, rays = dirs.shape[:2]
    shape = (n, PLANES + MAX_OBJECTS, rays)
    # Only t needs a value in empty slots: the other fields are read at the nearest surface, which is never one.
    out = Hit(
        torch.full(shape, torch.inf), dirs.new_empty((*shape, 3)), dirs.new_empty((*shape, 2)),
        torch.empty(shape, dtype=torch.int64), dirs.new_empty((*shape, 2)),
    )
    planes = (plane_hit(eye, dirs, 1, 0.0, 1.0), plane_hit(eye, dirs, 2, scene.wall_z, -1.0))
    for index, plane in enumerate(planes):
        _write(out, (slice(None), index), plane)
    obj = scene.objects
    for kind, kernel in KERNELS.items():
        sel = obj.kind == kind
        if not sel.any():
            continue
        image, yaw, center = obj.image[sel], obj.yaw[sel], obj.center[sel]
        o = rotate_y(scene.camera.eye[image] - center, -yaw)[:, None, :]
        hit = kernel(o, rotate_y(dirs[image], -yaw[:, None]), obj.size[sel])
        _write(out, (image, PLANES + obj.slot[sel]), replace(hit, normal=rotate_y(hit.normal, yaw[:, None])))
    return out


def _write(out: Hit, index: tuple, hit: Hit) -> None:
    for f in fields(Hit):
        getattr(out, f.name)[index] = getattr(hit, f.name)


@dataclass(frozen=True)
class Surface:
    """The nearest hit per ray: t (N, R) (inf: nothing hit), surface id (N, R) (−1: nothing), semantic class,
    part, world normal (N, R, 3), uv, curvature (N, R, 2), albedo colour (N, R, 3) before texturing, and reach
    (N, 2 + MAX_OBJECTS, R): the ray parameter at which every surface is hit (inf: missed)."""

    t: Tensor
    surface: Tensor
    semantic: Tensor
    part: Tensor
    normal: Tensor
    uv: Tensor
    curvature: Tensor
    colour: Tensor
    reach: Tensor


def cast(scene: Scene, dirs: Tensor) -> Surface:
    """The nearest surface along world rays dirs (N, R, 3); t is camera depth when dirs have camera z = 1."""
    hits = candidates(scene, dirs)
    t, winner = hits.t.min(dim=1)
    hit = torch.isfinite(t)
    semantic, colour = _surface_tables(scene)

    n, rays = winner.shape

    def pick(field: Tensor) -> Tensor:  # (N, S, R, *rest) -> (N, R, *rest)
        rest = field.shape[3:]
        return field.gather(1, winner.view(n, 1, rays, *[1] * len(rest)).expand(n, 1, rays, *rest)).squeeze(1)

    def per_surface(table: Tensor) -> Tensor:  # (N, S, *rest) -> (N, R, *rest)
        rest = table.shape[2:]
        return table.gather(1, winner.view(n, rays, *[1] * len(rest)).expand(n, rays, *rest))

    return Surface(
        t, torch.where(hit, winner, -1), torch.where(hit, per_surface(semantic), IGNORE),
        torch.where(hit, pick(hits.part), IGNORE), pick(hits.normal), pick(hits.uv), pick(hits.curvature),
        per_surface(colour), hits.t,
    )


def _surface_tables(scene: Scene) -> tuple[Tensor, Tensor]:
    """Semantic class (N, 2 + MAX_OBJECTS) and colour (N, 2 + MAX_OBJECTS, 3) of every surface id."""
    n, obj = len(scene), scene.objects
    semantic = torch.full((n, PLANES + MAX_OBJECTS), IGNORE, dtype=torch.int64)
    semantic[:, :PLANES] = torch.arange(PLANES)
    semantic[obj.image, PLANES + obj.slot] = PLANES + obj.kind
    colour = torch.zeros((n, PLANES + MAX_OBJECTS, 3))
    colour[:, :PLANES] = scene.look.plane_colours
    colour[obj.image, PLANES + obj.slot] = obj.colour
    return semantic, colour


