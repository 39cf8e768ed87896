import math
import time

import numpy as np
import pytest
import torch

import manytask.benchmarks.scenes  # noqa: F401  (registers the benchmark)
from manytask.benchmarks import build_benchmark
from manytask.benchmarks.scenes import TASKS, resolve_tasks
from manytask.benchmarks.scenes.geometry import (
    BOX,
    CYLINDER,
    SPHERE,
    Look,
    Objects,
    Scene,
    focal,
    look_at,
    pixel_directions,
)
from manytask.benchmarks.scenes.render import CURVATURE_SCALE, EDGE_THRESHOLD, TARGETS, render, render_scenes
from manytask.benchmarks.scenes.styles import STYLES, sample_scenes, style
from manytask.errors import ManytaskError
from manytask.tasks.task import TaskKind


def one_scene(eye, target, objects=(), wall_z=2.5) -> Scene:
    """One image: a camera, objects given as (kind, centre, half-extents, yaw), plain grey surfaces."""
    camera = look_at(torch.tensor([eye], dtype=torch.float32), torch.tensor([target], dtype=torch.float32))
    m = len(objects)
    table = Objects(
        image=torch.zeros(m, dtype=torch.int64),
        slot=torch.arange(m),
        kind=torch.tensor([o[0] for o in objects], dtype=torch.int64),
        center=torch.tensor([o[1] for o in objects], dtype=torch.float32).reshape(m, 3),
        size=torch.tensor([o[2] for o in objects], dtype=torch.float32).reshape(m, 3),
        yaw=torch.tensor([o[3] for o in objects], dtype=torch.float32),
        colour=torch.full((m, 3), 0.5),
    )
    look = Look(
        plane_colours=torch.full((1, 2, 3), 0.5), texture=torch.tensor([2]), frequency=torch.tensor([2.0]),
        contrast=torch.tensor([0.3]), light=torch.tensor([[0.0, 1.0, 0.0]]), ambient=torch.tensor([0.3]),
    )
    return Scene(camera, table, look, wall_z)


def test_sphere_depth_and_normals_match_the_analytic_intersection():
    # Camera at (0, 1, −4) looking along +z: the camera frame is the world frame shifted to the eye.
    centre, radius, eye = np.array([0.0, 1.0, 0.0]), 1.0, np.array([0.0, 1.0, -4.0])
    out = render(one_scene(eye.tolist(), [0.0, 1.0, 0.0], [(SPHERE, centre.tolist(), [radius] * 3, 0.0)]), 9)
    assert out["depth"][0, 0, 4, 4] == pytest.approx(3.0, abs=1e-5)  # centre pixel: 4 − r
    assert torch.allclose(out["normals"][0, :, 4, 4], torch.tensor([0.0, 0.0, -1.0]), atol=1e-5)
    dirs = pixel_directions(9).double().numpy().reshape(9, 9, 3)
    for i, j in [(4, 4), (3, 5), (2, 4), (5, 3), (5, 5), (4, 6)]:
        d = dirs[i, j]
        oc = eye - centre
        a, b, c = d @ d, oc @ d, oc @ oc - radius**2
        t = (-b - math.sqrt(b * b - a * c)) / a
        normal = (eye + t * d - centre) / radius
        assert out["semseg"][0, i, j] == 2 and out["parts"][0, i, j] == (1 if normal[1] >= 0 else 2)
        assert out["depth"][0, 0, i, j].item() == pytest.approx(t, rel=1e-5)
        assert np.allclose(out["normals"][0, :, i, j].numpy(), normal, atol=1e-5)
        assert np.allclose(out["curvature"][0, :, i, j].numpy(), CURVATURE_SCALE / radius)


def test_floor_seen_by_a_pitched_camera_has_the_analytic_depth_and_camera_normal():
    pitch, height = math.radians(30), 2.0
    eye = [0.0, height, -height / math.tan(pitch)]
    out = render(one_scene(eye, [0.0, 0.0, 0.0], wall_z=50.0), 9)
    assert out["depth"][0, 0, 4, 4] == pytest.approx(height / math.sin(pitch), rel=1e-5)
    floor = out["semseg"][0] == 0
    expected = torch.tensor([0.0, math.cos(pitch), -math.sin(pitch)])  # world up in camera coordinates
    assert floor[4:].all() and torch.allclose(out["normals"][0].permute(1, 2, 0)[floor], expected, atol=1e-5)
    shading = 0.3 + 0.7 * 1.0  # the light is straight above: n·l = 1
    assert torch.allclose(out["reshading"][0, 0][floor], torch.tensor(shading))


def test_box_top_cylinder_side_and_keypoints_follow_the_geometry():
    box = (BOX, [-0.6, 0.3, 0.0], [0.3, 0.3, 0.3], 0.0)
    cylinder = (CYLINDER, [0.6, 0.4, 0.0], [0.25, 0.4, 0.25], 0.0)
    eye, size = [0.0, 2.0, -2.5], 64
    scene = one_scene(eye, [0.0, 0.3, 0.0], [box, cylinder])
    out = render(scene, size)
    assert set(out["semseg"].unique().tolist()) == {0, 1, 3, 4}
    assert set(out["parts"].unique().tolist()) == {0, 3, 4, 5, 6}
    up = scene.camera.rotation[0, 1]  # world up (0, 1, 0) in camera coordinates is the rotation's second row
    tops = out["parts"][0] == 3
    assert torch.allclose(out["normals"][0].permute(1, 2, 0)[tops], up, atol=1e-5)
    side = out["parts"][0] == 6
    assert torch.allclose(out["curvature"][0].permute(1, 2, 0)[side], torch.tensor([CURVATURE_SCALE / 0.25, 0.0]))
    assert (out["curvature"][0][:, out["parts"][0] == 5] == 0).all()
    rotation, f = scene.camera.rotation[0], focal(size, scene.camera.fov_deg)

    def heat_at(point):
        cam = (torch.tensor(point) - torch.tensor(eye)) @ rotation
        col, row = f * cam[0] / cam[2] + size / 2 - 0.5, -f * cam[1] / cam[2] + size / 2 - 0.5
        return out["keypoints"][0, 0, round(row.item()), round(col.item())].item()

    assert heat_at([-0.3, 0.6, -0.3]) > 0.75 and heat_at([-0.9, 0.0, -0.3]) > 0.75  # front corners: visible
    assert heat_at([0.6, 0.8, 0.0]) > 0.75  # the cylinder's top-cap centre
    assert heat_at([-0.9, 0.0, 0.3]) < 0.05  # the back-bottom-left corner, hidden behind the box
    assert out["keypoints"].max() <= 1.0
    saliency = out["saliency"][0, 0].bool()
    counts = [(out["semseg"][0] == k).sum() for k in (3, 4)]
    assert torch.equal(saliency, out["semseg"][0] == (3 if counts[0] >= counts[1] else 4))


def _camera_points(out: dict, size: int, fov_deg: float) -> torch.Tensor:
    """Back-project the depth map to camera-space points (H, W, 3)."""
    return out["depth"][0, 0, ..., None] * pixel_directions(size, fov_deg).reshape(size, size, 3)


def test_normals_agree_with_the_depth_gradient():
    size = 64
    scene = one_scene([0.3, 1.6, -2.0], [0.0, 0.3, 0.8], [(SPHERE, [0.0, 0.5, 0.8], [0.5] * 3, 0.0)])
    out = render(scene, size)
    points = _camera_points(out, size, scene.camera.fov_deg)
    dx = points[1:-1, 2:] - points[1:-1, :-2]
    dy = points[2:, 1:-1] - points[:-2, 1:-1]
    fd = torch.nn.functional.normalize(torch.linalg.cross(dx, dy), dim=-1)
    fd = torch.where((fd * points[1:-1, 1:-1]).sum(-1, keepdim=True) > 0, -fd, fd)  # face the camera
    normals = out["normals"][0].permute(1, 2, 0)[1:-1, 1:-1]
    semseg = out["semseg"][0]
    shifts = [(di, dj) for di in (-1, 0, 1) for dj in (-1, 0, 1)]
    same = torch.stack([semseg[1 + di : size - 1 + di, 1 + dj : size - 1 + dj] for di, dj in shifts])
    interior = (same == semseg[1:-1, 1:-1]).all(0)
    for cls in (0, 2):  # floor, sphere
        mask = interior & (semseg[1:-1, 1:-1] == cls)
        cosine = (fd[mask] * normals[mask]).sum(-1)
        assert mask.sum() > 100 and cosine.min() > 0.995


def _relative_jumps(depth: torch.Tensor) -> torch.Tensor:
    """(N, H, W): the largest |d_p − d_q| / min(d_p, d_q) over each pixel's 4-neighbours."""
    best = torch.zeros_like(depth)
    for a, b in [((..., slice(1, None), slice(None)), (..., slice(None, -1), slice(None))),
                 ((..., slice(None), slice(1, None)), (..., slice(None), slice(None, -1)))]:
        jump = (depth[a] - depth[b]).abs() / torch.minimum(depth[a], depth[b])
        best[a] = torch.maximum(best[a], jump)
        best[b] = torch.maximum(best[b], jump)
    return best


def test_occlusion_edges_sit_on_depth_discontinuities_and_slopes_give_none():
    scenes = sample_scenes([i % len(STYLES) for i in range(20)], 0, "edges")
    out = render_scenes(scenes, 32, ["depth", "occlusion_edges"])
    edges = out["occlusion_edges"][:, 0].bool()
    assert edges.any() and (_relative_jumps(out["depth"][:, 0])[edges] > EDGE_THRESHOLD).all()
    # A floor seen at a grazing angle: depth jumps by far more than 10 % between rows, yet it is one surface.
    plane = render(one_scene([0.0, 0.3, 0.0], [0.0, 0.0, 0.3 / math.tan(math.radians(30))], wall_z=1e4), 32)
    assert (plane["semseg"] == 0).all() and _relative_jumps(plane["depth"][:, 0]).max() > 0.3
    assert not plane["occlusion_edges"].any()
    wall = render(one_scene([0.4, 1.0, -3.0], [0.0, 0.6, 2.5]), 32)  # floor meets wall: a crease, not an edge
    assert set(wall["semseg"].unique().tolist()) == {0, 1} and not wall["occlusion_edges"].any()
    assert wall["texture_edges"].any()  # checker cells and the floor/wall boundary are texture edges


def test_same_seed_same_bytes_and_a_different_seed_differs():
    ids = [0, 1, 2, 3, 4, 0]
    a = render_scenes(sample_scenes(ids, 7, "x"), 16)
    b = render_scenes(sample_scenes(ids, 7, "x"), 16)
    c = render_scenes(sample_scenes(ids, 8, "x"), 16)
    assert set(a) == set(TARGETS)
    assert all(a[k].numpy().tobytes() == b[k].numpy().tobytes() for k in TARGETS)
    assert not torch.equal(a["image"], c["image"])


def test_styles_are_distinct_and_an_unknown_style_is_clear():
    assert len(STYLES) >= 4 and len({(s.texture, s.camera_height, s.palette) for s in STYLES}) == len(STYLES)
    assert style(1) is STYLES[1]
    with pytest.raises(ManytaskError, match="style 99 does not exist"):
        style(99)
    scenes = sample_scenes([3] * 50, 0, "count")  # style 3 puts 3 or 4 objects in every scene
    counts = torch.bincount(scenes.objects.image, minlength=50)
    assert counts.min() >= 3 and counts.max() <= 4


def _check_contract(task, size: int) -> None:
    spec, kind = task.spec, task.spec.kind
    for x, y in ((task.x_train, task.y_train), (task.x_test, task.y_test)):
        assert x.dtype == torch.float32 and x.shape[1:] == (3, size, size) and x.min() >= 0 and x.max() <= 1
        if kind is TaskKind.SEGMENTATION:
            assert y.dtype == torch.int64 and y.shape == (len(x), size, size)
            assert set(y.unique().tolist()) <= {*range(spec.num_outputs), 255}
            continue
        assert y.dtype == torch.float32 and y.shape == (len(x), spec.num_outputs, size, size)
        if kind in (TaskKind.EDGES, TaskKind.SALIENCY):
            assert set(y.unique().tolist()) <= {0.0, 1.0}
        if kind is TaskKind.NORMALS:
            norms = y.norm(dim=1)
            assert ((norms - 1).abs() < 1e-4).logical_or(norms == 0).all()
        if kind is TaskKind.DEPTH:
            assert y.min() >= 0


@pytest.mark.parametrize("tasks", ["nyud-like", "pascal-like", "sdnkterca"])
def test_benchmark_builds_per_the_dense_contract_with_shared_images(tasks):
    bench = build_benchmark("scenes", {"tasks": tasks, "size": 16, "train_per_task": 6, "test_size": 4}, seed=0)
    names = resolve_tasks(tasks)
    assert bench.task_names == names and bench.input_shape == (3, 16, 16)
    first = bench.tasks[names[0]]
    for name, task in bench.tasks.items():
        assert task.spec.kind is TASKS[name].kind and task.spec.num_outputs == TASKS[name].num_outputs
        assert task.x_train is first.x_train and task.x_test is first.x_test  # one rendering, no copies
        _check_contract(task, 16)
    assert bench.metadata["task_kinds"] == {n: TASKS[n].kind.value for n in names}
    if "autoencoding" in bench.tasks:
        assert bench.tasks["autoencoding"].y_train is first.x_train


def test_presets_letters_and_bad_names():
    assert resolve_tasks("nyud-like") == ["semseg", "depth", "normals", "edge"]
    assert resolve_tasks("sdnkt") == ["semseg", "depth", "normals", "keypoints", "texture_edges"]
    assert resolve_tasks(["parts", "curvature"]) == ["parts", "curvature"]
    with pytest.raises(ManytaskError, match="string of task letters"):
        resolve_tasks("sdx")
    with pytest.raises(ManytaskError, match="unknown scenes task 'colour'; valid choices"):
        resolve_tasks(["depth", "colour"])
    with pytest.raises(ManytaskError, match="name a task twice"):
        resolve_tasks("ss")


def test_disjoint_images_give_each_task_its_own_style():
    params = {"tasks": "sdn", "size": 16, "train_per_task": 5, "test_size": 4, "styles": 2, "images": "disjoint"}
    bench = build_benchmark("scenes", params, seed=1)
    assert bench.metadata["task_styles"] == {"semseg": 0, "depth": 1, "normals": 0}
    tasks = list(bench.tasks.values())
    assert not torch.equal(tasks[0].x_train, tasks[2].x_train)  # same style, different images
    assert tasks[0].x_test is tasks[1].x_test and bench.metadata["test_styles"].tolist() == [0, 1, 0, 1]
    for task in tasks:
        _check_contract(task, 16)
    shared = build_benchmark("scenes", {**params, "images": "shared"}, seed=1)
    assert shared.metadata["train_styles"].tolist() == [0, 1, 0, 1, 0]


def test_two_thousand_images_render():
    started = time.perf_counter()
    out = render_scenes(sample_scenes([i % 4 for i in range(2000)], 0, "bulk"), 32, ["image", "semseg"])
    print(f"2000 scenes at 32x32: {time.perf_counter() - started:.2f} s")
    assert out["image"].shape == (2000, 3, 32, 32) and out["semseg"].shape == (2000, 32, 32)
    assert (out["semseg"] >= 2).any(dim=(1, 2)).float().mean() > 0.9  # nearly every image shows an object


def test_boundaries_are_one_pixel_wide_and_occlusion_edges_mark_the_nearer_side():
    from manytask.benchmarks.scenes.render import label_edges, occlusion_edges

    labels = torch.zeros(1, 6, 6, 1, dtype=torch.int64)
    labels[:, :, 3:] = 1  # a vertical boundary between columns 2 and 3, and a horizontal one below row 3 on the left
    labels[:, 4:, :3] = 2
    want = torch.zeros(1, 6, 6, dtype=torch.bool)
    want[:, :, 2] = True
    want[:, 3, :3] = True
    assert torch.equal(label_edges(labels), want)
    # a near object (columns 3..5, depth 1) in front of a far wall (depth 4) that its rays miss
    t = torch.full((1, 6, 6), 4.0)
    t[:, :, 3:] = 1.0
    surface = (t == 1.0).long()
    reach = torch.stack([torch.full((1, 6, 6), 4.0), torch.where(t == 1.0, 1.0, torch.inf)], 1)
    want = torch.zeros(1, 6, 6, dtype=torch.bool)
    want[:, :, 3] = True  # the occluding pixel, not the occluded one
    assert torch.equal(occlusion_edges(t, surface, reach), want)


def test_texture_edge_maps_are_as_sparse_as_real_ones_and_edge_everywhere_scores_low():
    """Real edge maps (NYUD, BSDS, PASCAL) are 5–15 % positive; so is every style's at the default 32×32, and an
    all-ones prediction (F = 2p / (1 + p) at positive rate p) cannot pass for a trained edge detector."""
    from manytask.tasks.dense_metrics import edge_meter

    for index, look in enumerate(STYLES):
        edges = render_scenes(sample_scenes([index] * 100, 0, "rate"), 32, ["texture_edges"])["texture_edges"]
        rate = edges.mean().item()
        assert 0.05 <= rate <= 0.15, (look.name, rate)
        meter = edge_meter()
        meter.update(torch.full_like(edges, 10.0), edges)  # logits: sigmoid ≈ 1 everywhere
        assert meter.result()["odsf"] == pytest.approx(2 * rate / (1 + rate), abs=1e-6)
        assert meter.result()["odsf"] < 0.27
