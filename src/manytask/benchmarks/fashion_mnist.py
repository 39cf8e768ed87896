"""Fashion-MNIST (Zalando's 28x28 grayscale clothing images, 10 classes) and the `fashion-mnist` benchmark.

The files have MNIST's names and format (see `mnist.py`): `train-images-idx3-ubyte`, `train-labels-idx1-ubyte`,
`t10k-images-idx3-ubyte` and `t10k-labels-idx1-ubyte`, plain or gzipped. `root` defaults to where the Debian
package `dataset-fashion-mnist` installs them; any folder holding the four files works, and `root: null` is the
cache `$MANYTASK_CACHE/datasets/fashion-mnist`. `download: true` fetches the four official `.gz` files into `root`
when absent (MD5 checked, see `download.py`); with the default `root` and no Debian package, into the cache, as a
system folder is not writable.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from torch import Tensor

from manytask.benchmarks.base import Benchmark
from manytask.benchmarks.download import cache_root
from manytask.benchmarks.local_files import LocalFilesParams, single_task_benchmark
from manytask.benchmarks.mnist import find_idx_files, load_idx_dataset
from manytask.benchmarks.registry import register_benchmark

TITLE = "Fashion-MNIST"
DEFAULT_ROOT = "/usr/share/datasets/fashion-mnist"  # apt-get install dataset-fashion-mnist
CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")


class FashionMnistParams(LocalFilesParams):
    root: str | None = Field(DEFAULT_ROOT, description="folder of the four IDX files (plain or .gz); null: the cache")

    def folder(self, name: str) -> Path:
        """`root`; but the cache when asked to download into the default folder and the Debian package that would
        have filled it is not installed, since that system folder is not writable."""
        if self.download and self.root == DEFAULT_ROOT and not Path(DEFAULT_ROOT).is_dir():
            return cache_root(name)
        return super().folder(name)


def load_fashion_mnist(root: Path) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """`(x_train, y_train, x_test, y_test)`: float32 images `[N, 1, 28, 28]` in [0, 1] and int64 labels 0-9."""
    return load_idx_dataset(root, TITLE)


@register_benchmark(
    "fashion-mnist", FashionMnistParams, "Fashion-MNIST (10 clothing classes, 28x28 gray) from the IDX files"
)
def fashion_mnist(params: FashionMnistParams, seed: int) -> Benchmark:
    """One 10-class task from local Fashion-MNIST IDX files; `max_train` / `max_test` subsample by `seed`."""
    description = f"Fashion-MNIST 28x28 grayscale clothing images in [0, 1]: {', '.join(CLASSES)}"
    return single_task_benchmark("fashion-mnist", load_fashion_mnist, params, seed, description,
                                 {"classes": list(CLASSES)}, find=lambda root: find_idx_files(root, TITLE))
