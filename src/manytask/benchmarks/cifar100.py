"""CIFAR-100 read from the Python version of the official archive, and the `cifar100` benchmark (FL + TaLoS's
dataset, shared/specs/talos_fl.md).

Layout, under `root` itself or its subdirectory `cifar-100-python/`: `train` (50 000 images) and `test` (10 000),
pickled dicts with `data` (uint8, n x 3072, the pixel order of CIFAR-10), `fine_labels` (100 classes) and
`coarse_labels` (20 superclasses); an optional `meta` names them. They are read with CIFAR-10's restricted
unpickler, so a file naming any global but numpy's array reconstruction fails before anything runs. `root`
defaults to the cache `$MANYTASK_CACHE/datasets/cifar100`; `download: true` fetches the official archive into it
when the files are absent (MD5 checked, see `download.py`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from torch import Tensor

from manytask.benchmarks.base import Benchmark
from manytask.benchmarks.cifar10 import CifarFormat, read_cifar_pickle, to_tensors
from manytask.benchmarks.local_files import LocalFilesParams, single_task_benchmark
from manytask.benchmarks.registry import register_benchmark
from manytask.errors import ManytaskError

PY_DIR = "cifar-100-python"
FINE = CifarFormat("CIFAR-100", "fine_labels", 100)
COARSE = CifarFormat("CIFAR-100", "coarse_labels", 20)


class Cifar100Params(LocalFilesParams):
    labels: Literal["fine", "coarse"] = Field("fine", description="fine: 100 classes; coarse: 20 superclasses")


def find_cifar100(root: Path) -> tuple[Path, Path]:
    """The train and test files of the first layout under `root` that has both."""
    for folder in (Path(root) / PY_DIR, Path(root)):
        if (folder / "train").is_file() and (folder / "test").is_file():
            return folder / "train", folder / "test"
    folder = Path(root) / PY_DIR if (Path(root) / PY_DIR).is_dir() else Path(root)
    missing = next(f for f in (folder / "train", folder / "test") if not f.is_file())
    raise ManytaskError(
        f"CIFAR-100 file {missing} is missing; expected train and test as {root}/{PY_DIR}/* (Python version) or "
        f"directly in {root}."
    )


def load_cifar100(root: Path, fmt: CifarFormat = FINE) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """`(x_train, y_train, x_test, y_test)`: float32 images `[N, 3, 32, 32]` in [0, 1] and int64 labels."""
    train, test = find_cifar100(root)
    return (*to_tensors(*read_cifar_pickle(train, fmt)), *to_tensors(*read_cifar_pickle(test, fmt)))


@register_benchmark("cifar100", Cifar100Params, "CIFAR-100 (100 classes or 20 superclasses, 32x32 RGB) from its files")
def cifar100(params: Cifar100Params, seed: int) -> Benchmark:
    """One task from local CIFAR-100 files; `max_train` / `max_test` subsample by `seed`."""
    fmt = FINE if params.labels == "fine" else COARSE
    return single_task_benchmark(
        "cifar100", lambda root: load_cifar100(root, fmt), params, seed, "CIFAR-100 32x32 RGB images in [0, 1]",
        {"labels": params.labels}, num_classes=fmt.num_classes, find=find_cifar100,
    )
