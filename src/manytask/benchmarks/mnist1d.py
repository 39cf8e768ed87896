"""`mnist1d`: one 10-class task over 40-sample 1-D signals, generated locally by the `mnist1d` package."""

from __future__ import annotations

import random

import numpy as np
import torch
from pydantic import Field

from manytask.benchmarks.base import Benchmark
from manytask.benchmarks.registry import register_benchmark
from manytask.registry import Params
from manytask.seeding import derive_seed
from manytask.tasks.task import classification_task


class Mnist1dParams(Params):
    num_samples: int = Field(5000, ge=100)


def generate(num_samples: int, seed: int) -> dict[str, np.ndarray]:
    """Run mnist1d's generator (never its downloader), restoring the global RNG state it reseeds."""
    from mnist1d.data import get_dataset_args, make_dataset  # here: it imports matplotlib.pyplot (0.45 s)

    args = get_dataset_args()
    args.num_samples = num_samples
    args.seed = derive_seed(seed, "mnist1d") % 2**32
    np_state, py_state = np.random.get_state(), random.getstate()
    try:
        return make_dataset(args)
    finally:
        np.random.set_state(np_state)
        random.setstate(py_state)


@register_benchmark("mnist1d", Mnist1dParams, "one 10-class task over 1-D signals of length 40 (mnist1d)")
def mnist1d(params: Mnist1dParams, seed: int) -> Benchmark:
    """Build the single mnist1d task (80/20 train/test split, as the generator makes it)."""
    data = generate(params.num_samples, seed)
    arrays = (torch.from_numpy(np.asarray(data[k])) for k in ("x", "y", "x_test", "y_test"))
    task = classification_task("mnist1d", *arrays, num_classes=10, description="which digit template (0-9)")
    description = f"mnist1d: {params.num_samples} generated 1-D digit signals of length 40, 10 classes"
    return Benchmark("mnist1d", {"mnist1d": task}, description)
