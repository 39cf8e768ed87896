"""A benchmark of your own from a dataset whose rows are mappings with named fields and PIL images, the shape of a
Hugging Face `datasets` row: 12×12 greyscale pictures of one shape each (a square, a disc or a cross, small or
large, anywhere in the frame, on a noisy background), two tasks on the same pictures (`shape`: which shape,
`size`: small or large). `Benchmark.from_datasets` turns the rows into tensors (PIL images into channels-first
floats in [0, 1]).

Use it from a config with `imports: [examples/custom_dataset.py]` and `benchmark: {name: shapes}`."""

from __future__ import annotations

import numpy as np
from PIL import Image
from pydantic import Field
from torch.utils.data import Dataset

from manytask.benchmarks import Benchmark, register_benchmark
from manytask.registry import Params

SIDE = 12


def draw(shape: int, large: bool, rng: np.random.Generator) -> np.ndarray:
    """One picture: shape 0 a square, 1 a disc, 2 a cross, of radius 2 (small) or 4 (large), as uint8."""
    radius = 4 if large else 2
    cy, cx = rng.integers(radius, SIDE - radius, size=2)
    y, x = np.mgrid[:SIDE, :SIDE]
    dy, dx = np.abs(y - cy), np.abs(x - cx)
    inside = [(dy <= radius) & (dx <= radius), dy**2 + dx**2 <= radius**2,
              ((dy == 0) & (dx <= radius)) | ((dx == 0) & (dy <= radius))][shape]
    return (rng.integers(0, 60, size=(SIDE, SIDE)) + 180 * inside).astype(np.uint8)


class ShapeRows(Dataset):
    """Rows {"image": PIL image, "shape": int, "size": int}, drawn from `seed`."""

    def __init__(self, count: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.shapes = rng.integers(0, 3, size=count)
        self.sizes = rng.integers(0, 2, size=count)
        self.images = [draw(s, bool(z), rng) for s, z in zip(self.shapes, self.sizes, strict=True)]

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> dict:
        return {"image": Image.fromarray(self.images[i]), "shape": int(self.shapes[i]), "size": int(self.sizes[i])}


class ShapesParams(Params):
    train_size: int = Field(default=1200, ge=10, description="training pictures")
    test_size: int = Field(default=400, ge=10, description="test pictures")


@register_benchmark("shapes", ShapesParams, "example: PIL pictures of shapes, shape and size tasks")
def shapes(params: ShapesParams, seed: int) -> Benchmark:
    train, test = ShapeRows(params.train_size, seed), ShapeRows(params.test_size, seed + 1_000_003)
    return Benchmark.from_datasets("shapes", {"shape": (train, test), "size": (train, test)},
                                   "PIL pictures of shapes", label_key={"shape": "shape", "size": "size"})
