"""Writers of tiny NYUD_MT, PASCAL_MT and Taskonomy trees in the real layouts and file formats.

Every map is 12×16 (H×W) with simple regions so that its 8×8 resize can be worked out by hand: nearest sampling
picks rows 0 2 3 5 6 8 9 11 and columns 1 3 5 ... 15; edge max-pooling gathers rows [0,2) [1,3) [3,5) [4,6) [6,8)
[7,9) [9,11) [10,12) and column pairs [2j, 2j+2). Image k of a tree is one flat colour, `image_colour(k)`, so
loaded images identify which examples were picked and in which order (train examples first, then test).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from scipy.io import savemat

Image = pytest.importorskip("PIL.Image")  # the tests of a module importing these writers skip without Pillow

H, W = 12, 16
NYUD_TRAIN, NYUD_VAL = ["img_5001", "img_5002", "img_5003"], ["img_6001", "img_6002"]
PASCAL_TRAIN, PASCAL_VAL = ["2008_000002", "2008_000003", "2008_000007"], ["2008_000009", "2008_000016"]
# (building, point, view): numeric order puts point 2 before point 10
TASKONOMY_TRAIN = [("allensville", 2, 0), ("allensville", 10, 0), ("beechwood", 0, 1)]
TASKONOMY_TEST = [("collierville", 1, 0), ("collierville", 1, 3)]


def image_colour(index: int) -> tuple[int, int, int]:
    return (20 + 40 * index, 100, 230 - 30 * index)


def write_image(path: Path, index: int, fmt: str = "JPEG") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((H, W, 3), image_colour(index), dtype=np.uint8)).save(path, fmt, quality=100)


def write_png(path: Path, array: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path)


def write_npy(path: Path, array: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, array)


def write_lines(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{line}\n" for line in lines))


def columns_from(first: int, value, background, dtype=np.uint8, channels: int = 0) -> np.ndarray:
    """A map holding `value` in columns >= first and `background` left of them."""
    shape = (H, W, channels) if channels else (H, W)
    array = np.empty(shape, dtype=dtype)
    array[:, :first] = background
    array[:, first:] = value
    return array


# ---------------------------------------------------------------- NYUD_MT


def nyud_semseg() -> np.ndarray:
    """0 (unlabeled) in columns 0-3, 40 - row elsewhere (40 in row 0 down to 29 in row 11)."""
    labels = np.repeat((40 - np.arange(H))[:, None], W, axis=1).astype(np.uint8)
    labels[:, :4] = 0
    return labels


def nyud_depth() -> np.ndarray:
    """0.5 + 0.25·row + 0.01·column metres, 0 (missing) in columns 0-1."""
    rows, cols = np.meshgrid(np.arange(H), np.arange(W), indexing="ij")
    depth = (0.5 + 0.25 * rows + 0.01 * cols).astype(np.float32)
    depth[:, :2] = 0.0
    return depth


def nyud_edge() -> np.ndarray:
    edge = np.zeros((H, W), dtype=np.float32)
    edge[4, :] = 1.0
    edge[:, 10] = 1.0
    return edge


def write_nyud(root: Path) -> Path:
    """NYUD_MT/{images,segmentation,depth,normals,edge,gt_sets} for 3 train and 2 val ids."""
    write_lines(root / "gt_sets" / "train.txt", NYUD_TRAIN)
    write_lines(root / "gt_sets" / "val.txt", NYUD_VAL)
    for index, image_id in enumerate(NYUD_TRAIN + NYUD_VAL):
        write_image(root / "images" / f"{image_id}.jpg", index)
        write_png(root / "segmentation" / f"{image_id}.png", nyud_semseg())
        write_npy(root / "depth" / f"{image_id}.npy", nyud_depth())
        write_npy(root / "normals" / f"{image_id}.npy", columns_from(8, (3.0, 0.0, 4.0), 0.0, np.float32, 3))
        write_npy(root / "edge" / f"{image_id}.npy", nyud_edge())
    return root


# ---------------------------------------------------------------- PASCAL_MT

WALL, SKY = 440, 360  # PASCAL-Context ids: wall has NYUD-like normals, sky has none


def pascal_semseg() -> np.ndarray:
    """Background (0) in columns 0-7, person (15) in 8-15, ignored (255) in row 0."""
    labels = columns_from(8, 15, 0)
    labels[0] = 255
    return labels


def part_struct(parts: list[tuple[str, np.ndarray]]) -> np.ndarray:
    """A 1×M MATLAB struct array (part_name, mask), or the empty matrix Pascal-Part stores for no parts."""
    if not parts:
        return np.zeros((0, 0))
    struct = np.zeros((1, len(parts)), dtype=[("part_name", "O"), ("mask", "O")])
    for k, (name, mask) in enumerate(parts):
        struct[0, k] = (name, mask.astype(np.uint8))
    return struct


def write_parts(path: Path, objects: list[tuple[str, int, list[tuple[str, np.ndarray]]]]) -> None:
    """A Pascal-Part annotation: struct anno(imname, objects(class, class_ind, mask, parts))."""
    struct = np.zeros((1, len(objects)), dtype=[("class", "O"), ("class_ind", "O"), ("mask", "O"), ("parts", "O")])
    for k, (name, class_ind, parts) in enumerate(objects):
        mask = np.zeros((H, W), dtype=np.uint8)
        for _, part_mask in parts:
            mask |= part_mask.astype(np.uint8)
        struct[0, k] = (name, np.array([[class_ind]], dtype=np.uint8), mask, part_struct(parts))
    path.parent.mkdir(parents=True, exist_ok=True)
    savemat(path, {"anno": {"imname": path.stem, "objects": struct}})


def rows_right(first: int, last: int) -> np.ndarray:
    """Rows first..last of columns 8-15."""
    mask = np.zeros((H, W), dtype=bool)
    mask[first:last + 1, 8:] = True
    return mask


PERSON_PARTS = [("head", rows_right(0, 3)), ("torso", rows_right(4, 7)), ("llleg", rows_right(8, 11))]
DOG = ("dog", 12, [("head", rows_right(0, 5))])


def write_pascal(root: Path) -> Path:
    """PASCAL_MT for 3 train and 2 val ids. Image 0 has a person with head/torso/lower-leg parts (and a dog), image
    1 a person without parts; image 1's semseg is also in semseg/VOC12 (all class 7), which takes precedence."""
    write_lines(root / "ImageSets" / "Context" / "train.txt", PASCAL_TRAIN)
    write_lines(root / "ImageSets" / "Context" / "val.txt", PASCAL_VAL)
    for index, image_id in enumerate(PASCAL_TRAIN + PASCAL_VAL):
        write_image(root / "JPEGImages" / f"{image_id}.jpg", index)
        write_png(root / "semseg" / "pascal-context" / f"{image_id}.png", pascal_semseg())
        objects = {0: [("person", 15, PERSON_PARTS), DOG], 1: [("person", 15, []), DOG]}.get(index, [DOG])
        write_parts(root / "human_parts" / f"{image_id}.mat", objects)
        write_png(root / "normals_distill" / f"{image_id}.png", np.full((H, W, 3), (0, 255, 255), dtype=np.uint8))
        salient = np.full((H, W), 127, dtype=np.uint8)
        salient[:6] = 128  # 128/255 > 0.5 >= 127/255
        write_png(root / "sal_distill" / f"{image_id}.png", salient)
        label_map = columns_from(8, SKY, WALL, np.uint16)
        (root / "pascal-context" / "trainval").mkdir(parents=True, exist_ok=True)
        savemat(root / "pascal-context" / "trainval" / f"{image_id}.mat", {"LabelMap": label_map})
    write_png(root / "semseg" / "VOC12" / f"{PASCAL_TRAIN[1]}.png", np.full((H, W), 7, dtype=np.uint8))
    return root


# ---------------------------------------------------------------- Taskonomy

GREY, NORMAL_RGB = (127, 127, 127), (255, 128, 0)
KEYPOINTS_RAW, TEXTURE_RAW, OCCLUSION_RAW = 150, 1788, 295
RESHADING_RGB, CURVATURE_RGB = (51, 102, 153), (128, 64, 0)


def taskonomy_file(root: Path, view: tuple[str, int, int], domain: str) -> Path:
    building, point, number = view
    return root / building / domain / f"point_{point}_view_{number}_domain_{domain}.png"


def taskonomy_semseg() -> np.ndarray:
    """Uncertain (0) in row 0, background (1) in columns 0-7, class 17 in columns 8-15."""
    labels = columns_from(8, 17, 1)
    labels[0] = 0
    return labels


def taskonomy_depth() -> np.ndarray:
    """512·(row + 1) + 128·column (row + 1 + column/4 metres), 65535 (missing) in columns 0-1."""
    rows, cols = np.meshgrid(np.arange(H), np.arange(W), indexing="ij")
    depth = (512 * (rows + 1) + 128 * cols).astype(np.uint16)
    depth[:, :2] = 65535
    return depth


def write_taskonomy(root: Path) -> Path:
    """<building>/<domain>/point_<i>_view_<j>_domain_<domain>.png for 3 train views (2 buildings) and 2 test views."""
    flat = {
        "keypoints2d": KEYPOINTS_RAW, "edge_texture": TEXTURE_RAW, "edge_occlusion": OCCLUSION_RAW,
    }
    for index, view in enumerate(TASKONOMY_TRAIN + TASKONOMY_TEST):
        write_image(taskonomy_file(root, view, "rgb"), index, "PNG")
        write_png(taskonomy_file(root, view, "segment_semantic"), taskonomy_semseg())
        write_png(taskonomy_file(root, view, "depth_zbuffer"), taskonomy_depth())
        write_png(taskonomy_file(root, view, "normal"), columns_from(4, NORMAL_RGB, GREY, channels=3))
        for domain, raw in flat.items():
            write_png(taskonomy_file(root, view, domain), np.full((H, W), raw, dtype=np.uint16))
        write_png(taskonomy_file(root, view, "reshading"), np.full((H, W, 3), RESHADING_RGB, dtype=np.uint8))
        write_png(taskonomy_file(root, view, "principal_curvature"),
                  np.full((H, W, 3), CURVATURE_RGB, dtype=np.uint8))
    return root
