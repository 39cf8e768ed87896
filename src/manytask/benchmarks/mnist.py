"""MNIST read from the four official IDX files (plain or gzipped), and the `mnist` benchmark. The loader serves
any dataset in MNIST's format (`load_idx_dataset(root, title)`; Fashion-MNIST uses it).

Expected in `root`: `train-images-idx3-ubyte`, `train-labels-idx1-ubyte`, `t10k-images-idx3-ubyte` and
`t10k-labels-idx1-ubyte`, each possibly with a `.gz` suffix (as downloaded). An IDX file is a big-endian header
(magic `0x00000801` for a 1-D uint8 label vector or `0x00000803` for a 3-D uint8 image array, then one uint32 per
dimension) followed by the values. `root` defaults to the cache `$MANYTASK_CACHE/datasets/mnist`; `download: true`
fetches the four official `.gz` files into it when absent, trying MNIST's mirrors in turn (MD5 checked, see
`download.py`).
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from manytask.benchmarks.base import Benchmark
from manytask.benchmarks.local_files import LocalFilesParams, single_task_benchmark
from manytask.benchmarks.registry import register_benchmark
from manytask.errors import ManytaskError

IDX_NDIM = {0x00000801: 1, 0x00000803: 3}  # magic -> number of dimensions (uint8 values)
MNIST_FILES = ["train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"]
SIDE = 28


def read_idx(path: Path, title: str | None = None) -> np.ndarray:
    """The uint8 array of an IDX label (1-D) or image (3-D) file; `.gz` files are decompressed. Errors name the
    file as one of dataset `title`'s (e.g. "MNIST") when it is given."""
    path = Path(path)
    kind = f"{title} IDX file" if title else "IDX file"
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError, zlib.error) as err:
        raise ManytaskError(f"could not read {kind} {path}: {err}.") from None
    magic = int.from_bytes(raw[:4], "big") if len(raw) >= 4 else None
    if magic not in IDX_NDIM:
        named = f"{title} file {path}" if title else str(path)
        raise ManytaskError(f"{named} is not a uint8 IDX file (magic number 0x00000801 or 0x00000803 expected).")
    ndim = IDX_NDIM[magic]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ManytaskError(f"{kind} {path} is truncated inside its header.")
    shape = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    expected = header + int(np.prod(shape))
    if len(raw) != expected:
        cut = "is truncated: it " if len(raw) < expected else ""
        raise ManytaskError(f"{kind} {path} {cut}has {len(raw)} bytes but its header {shape} needs {expected}.")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape)


def find_idx_files(root: Path, title: str) -> list[Path]:
    """The four IDX files of dataset `title` under `root` (train images, train labels, test images, test labels),
    plain or `.gz`; MNIST and Fashion-MNIST share the file names."""
    root = Path(root)
    found = []
    for name in MNIST_FILES:
        path = next((p for p in (root / name, root / f"{name}.gz") if p.is_file()), None)
        if path is None:
            raise ManytaskError(
                f"{title} file {root / name} (or {name}.gz) is missing; expected {', '.join(MNIST_FILES)} in {root}."
            )
        found.append(path)
    return found


def load_idx_dataset(root: Path, title: str) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """`(x_train, y_train, x_test, y_test)` of the MNIST-format dataset `title` under `root`: float32 images
    `[N, 1, 28, 28]` in [0, 1] and int64 labels 0-9."""
    train_images, train_labels, test_images, test_labels = find_idx_files(root, title)
    return (*_load_split(train_images, train_labels, title), *_load_split(test_images, test_labels, title))


def find_mnist(root: Path) -> list[Path]:
    """The four MNIST files under `root` (train images, train labels, test images, test labels), plain or `.gz`."""
    return find_idx_files(root, "MNIST")


def load_mnist(root: Path) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """`(x_train, y_train, x_test, y_test)`: float32 images `[N, 1, 28, 28]` in [0, 1] and int64 labels."""
    return load_idx_dataset(root, "MNIST")


def _load_split(image_path: Path, label_path: Path, title: str = "MNIST") -> tuple[Tensor, Tensor]:
    images, labels = read_idx(image_path, title), read_idx(label_path, title)
    if images.ndim != 3 or images.shape[1:] != (SIDE, SIDE) or labels.ndim != 1:
        raise ManytaskError(f"{title} files {image_path} and {label_path} do not hold 28x28 images and labels.")
    if len(images) != len(labels):
        raise ManytaskError(f"{title} file {image_path} has {len(images)} images but {label_path} has {len(labels)}.")
    if len(labels) and int(labels.max()) > 9:
        raise ManytaskError(f"{title} file {label_path} has label {int(labels.max())}; labels must be 0-9.")
    x = torch.from_numpy(images.astype(np.float32)).div_(255.0).unsqueeze(1)
    return x, torch.from_numpy(labels.astype(np.int64))


@register_benchmark("mnist", LocalFilesParams, "MNIST (10 classes, 28x28 gray) from the official IDX files")
def mnist(params: LocalFilesParams, seed: int) -> Benchmark:
    """One 10-class task from local MNIST IDX files; `max_train` / `max_test` subsample by `seed`."""
    return single_task_benchmark(
        "mnist", load_mnist, params, seed, "MNIST 28x28 grayscale digits in [0, 1]", find=find_mnist
    )
