"""CIFAR-10 read from the files of either official archive, and the `cifar10` benchmark.

Two layouts are accepted, under `root` itself or its subdirectory of the same name as in the archive:

    cifar-10-batches-bin/data_batch_1.bin ... data_batch_5.bin, test_batch.bin   (binary version)
    cifar-10-batches-py/data_batch_1 ... data_batch_5, test_batch                (Python version)

A binary record is 1 label byte then 3072 pixel bytes (1024 red, 1024 green, 1024 blue, each 32x32 row-major).
A Python batch is a pickled dict with `data` (uint8, n x 3072, same pixel order) and `labels` (list of ints).

Pickles can run arbitrary code when loaded, so the Python version is read with a restricted unpickler. Plain
containers, bytes, strings and numbers need no globals at all; the official files however pickle `data` as a numpy
array, whose reconstruction names `numpy.core.multiarray._reconstruct` (`numpy._core.multiarray._reconstruct` when
written by numpy 2), `numpy.ndarray` and `numpy.dtype`. Exactly these globals are admitted and every other one is
refused, so a file naming e.g. `os.system` fails before anything runs. The loaded object must then be a dict with
bytes/str keys and list/bytes/str/int values, except `data`, which may be a uint8 array or plain bytes; anything
else is refused. Files written with pickle protocol 5 (`numpy._core.numeric._frombuffer`) or with protocol 2 from
Python 3 (`_codecs.encode`) are therefore refused; rewrite them with protocol 3 or 4.

`root` defaults to the cache `$MANYTASK_CACHE/datasets/cifar10`; with `download: true` and no complete layout there,
the official Python-version archive is fetched, its MD5 checked and unpacked into it (see `download.py`).
"""

from __future__ import annotations

import io
import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from manytask.benchmarks.base import Benchmark
from manytask.benchmarks.local_files import LocalFilesParams, single_task_benchmark
from manytask.benchmarks.registry import register_benchmark
from manytask.errors import ManytaskError

CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
SIDE = 32
PIXELS = 3 * SIDE * SIDE  # 3072 bytes per image
RECORD = 1 + PIXELS  # label byte + pixels in the binary version
BATCHES = [*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"]  # 5 train batches, then the test batch
BIN_DIR, PY_DIR = "cifar-10-batches-bin", "cifar-10-batches-py"

# module -> names the unpickler may import. `_reconstruct(ndarray, shape, dtype)` allocates an empty array and
# `ndarray.__setstate__` / `dtype.__setstate__` fill in raw bytes and a type description: they only rebuild arrays
# from data and call no user-supplied code, unlike arbitrary globals (os.system, builtins.eval, ...).
SAFE_GLOBALS = {
    "numpy.core.multiarray": {"_reconstruct"},
    "numpy._core.multiarray": {"_reconstruct"},
    "numpy": {"ndarray", "dtype"},
}
_SAFE_SCALARS = (bytes, str, int)


@dataclass(frozen=True)
class CifarFormat:
    """What differs between the CIFAR archives' Python batches: the name in messages, the label key and the
    number of classes (CIFAR-100's `fine_labels` or `coarse_labels`)."""

    name: str
    label_key: str
    num_classes: int


CIFAR10 = CifarFormat("CIFAR-10", "labels", len(CIFAR10_CLASSES))


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that resolves only the numpy array reconstruction globals of `SAFE_GLOBALS`."""

    def find_class(self, module: str, name: str) -> object:
        if name not in SAFE_GLOBALS.get(module, ()):
            raise pickle.UnpicklingError(f"global '{module}.{name}' is not allowed")
        return super().find_class(module, name)


def restricted_load(data: bytes) -> object:
    """Unpickle `data` admitting no globals but numpy array reconstruction; Python 2 strings load as bytes."""
    return RestrictedUnpickler(io.BytesIO(data), encoding="bytes").load()


def read_cifar_bin(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Images `[n, 3, 32, 32]` uint8 and int64 labels of one binary-version batch file."""
    raw = np.frombuffer(Path(path).read_bytes(), dtype=np.uint8)
    if raw.size % RECORD:
        raise ManytaskError(f"CIFAR-10 file {path} has {raw.size} bytes, not a multiple of the {RECORD}-byte record.")
    records = raw.reshape(-1, RECORD)
    return _checked(path, records[:, 1:], records[:, 0], CIFAR10)


def read_cifar_pickle(path: Path, fmt: CifarFormat = CIFAR10) -> tuple[np.ndarray, np.ndarray]:
    """Images `[n, 3, 32, 32]` uint8 and int64 labels of one Python-version batch file (restricted unpickling)."""
    try:
        batch = restricted_load(Path(path).read_bytes())
    except Exception as err:  # any malformed or disallowed pickle; nothing outside SAFE_GLOBALS can have run
        raise ManytaskError(f"{fmt.name} file {path} is not a safe CIFAR pickle ({err}).") from None
    batch = _checked_batch(path, batch, fmt)
    data, labels = batch.get("data"), batch.get(fmt.label_key)
    if isinstance(data, bytes):
        data = np.frombuffer(data, dtype=np.uint8)
    if not isinstance(data, np.ndarray) or not isinstance(labels, list) or not all(type(v) is int for v in labels):
        raise ManytaskError(
            f"{fmt.name} file {path} needs 'data' (uint8 array or bytes) and '{fmt.label_key}' (list of ints)."
        )
    if data.shape != (len(labels), PIXELS) and data.shape != (len(labels) * PIXELS,):
        raise ManytaskError(
            f"{fmt.name} file {path} holds data of shape {data.shape} for {len(labels)} labels, not ({len(labels)}, "
            f"{PIXELS})."
        )
    return _checked(path, data, np.asarray(labels, dtype=np.int64), fmt)


def _checked_batch(path: Path, batch: object, fmt: CifarFormat) -> dict[str, object]:
    """The batch dict with str keys, after checking it holds only plain values and a uint8 `data` array."""
    if not isinstance(batch, dict) or not all(isinstance(k, (bytes, str)) for k in batch):
        raise ManytaskError(f"{fmt.name} file {path} is not a dict with string keys.")
    clean = {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in batch.items()}
    for key, value in clean.items():
        plain = isinstance(value, _SAFE_SCALARS) or (
            isinstance(value, list) and all(isinstance(v, _SAFE_SCALARS) for v in value)
        )
        array = key == "data" and type(value) is np.ndarray and value.dtype == np.uint8
        if not (plain or array):
            raise ManytaskError(f"{fmt.name} file {path} has an unexpected {type(value).__name__} under '{key}'.")
    return clean


def _checked(path: Path, pixels: np.ndarray, labels: np.ndarray, fmt: CifarFormat) -> tuple[np.ndarray, np.ndarray]:
    bad = labels[(labels < 0) | (labels >= fmt.num_classes)]
    if len(bad):
        raise ManytaskError(f"{fmt.name} file {path} has label {int(bad[0])}; labels must be 0-{fmt.num_classes - 1}.")
    return pixels.reshape(-1, 3, SIDE, SIDE), labels.astype(np.int64)


def find_cifar10(root: Path) -> tuple[list[Path], bool]:
    """The six batch files (5 train, then test) of the first complete layout under `root`, and whether binary."""
    root = Path(root)
    layouts = [(root / BIN_DIR, True), (root / PY_DIR, False), (root, True), (root, False)]
    candidates = [([d / (b + ".bin" if binary else b) for b in BATCHES], binary) for d, binary in layouts]
    for files, binary in candidates:
        if all(f.is_file() for f in files):
            return files, binary
    files, _ = max(candidates, key=lambda c: sum(f.is_file() for f in c[0]))  # the most complete layout
    missing = next(f for f in files if not f.is_file())
    raise ManytaskError(
        f"CIFAR-10 file {missing} is missing; expected data_batch_1..5 and test_batch as {root}/{BIN_DIR}/*.bin "
        f"(binary version) or {root}/{PY_DIR}/* (Python version), or those files directly in {root}."
    )


def load_cifar10(root: Path) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """`(x_train, y_train, x_test, y_test)`: float32 images `[N, 3, 32, 32]` in [0, 1] and int64 labels."""
    files, binary = find_cifar10(root)
    read = read_cifar_bin if binary else read_cifar_pickle
    batches = [read(f) for f in files]
    train = [np.concatenate([b[i] for b in batches[:-1]]) for i in (0, 1)]
    return (*to_tensors(*train), *to_tensors(*batches[-1]))


def to_tensors(images: np.ndarray, labels: np.ndarray) -> tuple[Tensor, Tensor]:
    return torch.from_numpy(images.astype(np.float32)).div_(255.0), torch.from_numpy(labels.astype(np.int64))


@register_benchmark("cifar10", LocalFilesParams, "CIFAR-10 (10 classes, 32x32 RGB) from the official files")
def cifar10(params: LocalFilesParams, seed: int) -> Benchmark:
    """One 10-class task from local CIFAR-10 files; `max_train` / `max_test` subsample by `seed`."""
    return single_task_benchmark(
        "cifar10", load_cifar10, params, seed, "CIFAR-10 32x32 RGB images in [0, 1]",
        {"classes": list(CIFAR10_CLASSES)}, find=find_cifar10,
    )
