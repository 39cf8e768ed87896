"""A benchmark of your own from a dataset whose rows are mappings with named fields and PIL images, the shape of a
Hugging Face `datasets` row: scikit-learn's bundled 8×8 digits as greyscale images, two tasks on the same images
(`digit`: which digit, `parity`: even or odd). `Benchmark.from_datasets` turns the rows into tensors (PIL images into
channels-first floats in [0, 1]).

Use it from a config with `imports: [examples/custom_dataset.py]` and `benchmark: {name: pil-digits}`."""

from __future__ import annotations

import numpy as np
from PIL import Image
from pydantic import Field
from sklearn.datasets import load_digits
from torch.utils.data import Dataset

from manytask.benchmarks import Benchmark, register_benchmark
from manytask.registry import Params


class DigitRows(Dataset):
    """Rows {"image": PIL image, "digit": int, "parity": int} of the digits at `indices`."""

    def __init__(self, indices: np.ndarray) -> None:
        digits = load_digits()
        self.images = (digits.images[indices] * (255 / 16)).astype(np.uint8)
        self.digits = digits.target[indices]

    def __len__(self) -> int:
        return len(self.digits)

    def __getitem__(self, i: int) -> dict:
        digit = int(self.digits[i])
        return {"image": Image.fromarray(self.images[i]), "digit": digit, "parity": digit % 2}


class PilDigitsParams(Params):
    test_fraction: float = Field(default=0.25, gt=0, lt=1, description="share of the images held out for testing")


@register_benchmark("pil-digits", PilDigitsParams, "example: sklearn's digits as PIL images, digit and parity tasks")
def pil_digits(params: PilDigitsParams, seed: int) -> Benchmark:
    order = np.random.default_rng(seed).permutation(len(load_digits().target))
    cut = int(len(order) * (1 - params.test_fraction))
    train, test = DigitRows(order[:cut]), DigitRows(order[cut:])
    return Benchmark.from_datasets("pil-digits", {"digit": (train, test), "parity": (train, test)},
                                   "sklearn's digits as PIL images", label_key={"digit": "digit", "parity": "parity"})
