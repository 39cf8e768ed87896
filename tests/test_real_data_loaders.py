"""CIFAR-10 (binary and pickle versions) and MNIST (IDX) loaders on tiny files written in the official formats."""

from __future__ import annotations

import gzip
import os
import pickle
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch

from manytask.benchmarks import BENCHMARKS, build_benchmark
from manytask.benchmarks.cifar10 import RestrictedUnpickler, load_cifar10, read_cifar_pickle, restricted_load
from manytask.benchmarks.mnist import load_mnist, read_idx
from manytask.errors import ManytaskError
from tests.data_files import (
    NUM_TEST,
    TRAIN_COUNTS,
    batch_files,
    cifar_image,
    cifar_label,
    idx_bytes,
    mnist_arrays,
    py2_pickle,
    write_cifar_bin,
    write_cifar_py,
    write_mnist,
)

# ---------------------------------------------------------------- CIFAR-10: what the written files hold


def expected_cifar(test: bool) -> tuple[torch.Tensor, torch.Tensor]:
    count = NUM_TEST if test else sum(TRAIN_COUNTS)
    x = torch.stack([torch.from_numpy(cifar_image(i)).float() / 255.0 for i in range(count)])
    return x, torch.tensor([cifar_label(i, test) for i in range(count)], dtype=torch.long)


def assert_cifar(loaded: tuple[torch.Tensor, ...]) -> None:
    x_train, y_train, x_test, y_test = loaded
    assert x_train.shape == (7, 3, 32, 32) and x_test.shape == (3, 3, 32, 32)
    assert x_train.dtype == torch.float32 and y_train.dtype == torch.int64
    for (x, y), test in (((x_train, y_train), False), ((x_test, y_test), True)):
        want_x, want_y = expected_cifar(test)
        assert torch.equal(x, want_x) and torch.equal(y, want_y)
    # channel order: the first 1024 bytes of a record are red, row-major
    assert x_train[0, 0, 0, 1] == 1 / 255 and x_train[0, 0, 1, 0] == 3 / 255 and x_train[0, 1, 0, 0] == 80 / 255


# ---------------------------------------------------------------- CIFAR-10 tests


@pytest.mark.parametrize("subdir", ["cifar-10-batches-bin", ""])
def test_cifar_binary_version(tmp_path: Path, subdir: str) -> None:
    write_cifar_bin(tmp_path / subdir)
    assert_cifar(load_cifar10(tmp_path))


@pytest.mark.parametrize("subdir", ["cifar-10-batches-py", ""])
@pytest.mark.parametrize("data_as_bytes", [False, True])
def test_cifar_python_version(tmp_path: Path, subdir: str, data_as_bytes: bool) -> None:
    write_cifar_py(tmp_path / subdir, data_as_bytes)
    assert_cifar(load_cifar10(tmp_path))


def test_cifar_python2_pickles_like_the_official_files(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    for name, (data, labels) in batch_files():
        (folder / name).write_bytes(py2_pickle(data, labels))
    assert_cifar(load_cifar10(tmp_path))


def test_cifar_root_may_be_the_batches_dir(tmp_path: Path) -> None:
    assert_cifar(load_cifar10(write_cifar_bin(tmp_path / "cifar-10-batches-bin")))


class SystemCall:
    """Pickles as a call of os.system: what a malicious batch file would contain."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


class EvalCall:
    def __reduce__(self):
        return eval, ("1 + 1",)


def test_restricted_unpickler_refuses_code_execution(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    folder = write_cifar_py(tmp_path / "cifar-10-batches-py")
    payload = {b"data": SystemCall(f"touch {marker}"), b"labels": [0]}
    (folder / "data_batch_3").write_bytes(pickle.dumps(payload, protocol=4))
    with pytest.raises(ManytaskError, match=r"data_batch_3 is not a safe CIFAR pickle.*system.*not allowed"):
        load_cifar10(tmp_path)
    assert not marker.exists()
    for proto in (0, 2, 4, 5):
        with pytest.raises(pickle.UnpicklingError):
            restricted_load(pickle.dumps(SystemCall(f"touch {marker}"), protocol=proto))
        with pytest.raises(pickle.UnpicklingError, match=r"(builtins|__builtin__)\.eval"):
            restricted_load(pickle.dumps([EvalCall()], protocol=proto))
    assert not marker.exists()


def test_restricted_unpickler_admits_only_plain_values_and_arrays() -> None:
    plain = {b"a": [1, 2.5, b"x", "y", (1, None)], "b": {1, 2}}
    assert restricted_load(pickle.dumps(plain, protocol=4)) == plain
    array = np.arange(6, dtype=np.uint8).reshape(2, 3)
    assert np.array_equal(restricted_load(pickle.dumps(array, protocol=4)), array)
    assert issubclass(RestrictedUnpickler, pickle.Unpickler)
    with pytest.raises(pickle.UnpicklingError, match=r"collections\.OrderedDict"):
        restricted_load(pickle.dumps(OrderedDict(a=1), protocol=4))


@pytest.mark.parametrize(
    "batch, message",
    [
        ({b"data": np.zeros((1, 3072), np.float64), b"labels": [0]}, "unexpected ndarray under 'data'"),
        ({b"data": np.zeros((1, 3072), np.uint8), b"labels": [0], b"x": {1}}, "unexpected set under 'x'"),
        ({b"data": np.zeros((1, 3072), np.uint8), b"labels": np.zeros(1, np.uint8)}, "unexpected ndarray"),
        ({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0]}, r"shape \(2, 3072\) for 1 labels"),
        ({b"data": b"\0" * 3071, b"labels": [0]}, r"shape \(3071,\)"),
        ({b"data": b"\0" * 3072, b"labels": [10]}, "label 10; labels must be 0-9"),
        ({b"labels": [0]}, "needs 'data'"),
        ([1, 2], "not a dict"),
        ({1: b""}, "not a dict with string keys"),
    ],
)
def test_cifar_pickle_contents_are_checked(tmp_path: Path, batch: object, message: str) -> None:
    path = tmp_path / "data_batch_1"
    path.write_bytes(pickle.dumps(batch, protocol=4))
    with pytest.raises(ManytaskError, match=message):
        read_cifar_pickle(path)


def test_cifar_missing_and_broken_files(tmp_path: Path) -> None:
    with pytest.raises(ManytaskError, match=r"data_batch_1\.bin is missing; expected .*cifar-10-batches-py"):
        load_cifar10(tmp_path)
    folder = write_cifar_bin(tmp_path / "cifar-10-batches-bin")
    (folder / "data_batch_5.bin").unlink()
    with pytest.raises(ManytaskError, match=r"cifar-10-batches-bin/data_batch_5\.bin is missing"):
        load_cifar10(tmp_path)
    py = write_cifar_py(tmp_path / "other" / "cifar-10-batches-py")
    (py / "test_batch").unlink()
    with pytest.raises(ManytaskError, match=r"cifar-10-batches-py/test_batch is missing"):
        load_cifar10(tmp_path / "other")
    write_cifar_bin(folder)
    with (folder / "test_batch.bin").open("ab") as f:
        f.write(b"\0")
    with pytest.raises(ManytaskError, match=r"test_batch\.bin has 9220 bytes, not a multiple of the 3073-byte"):
        load_cifar10(tmp_path)
    (folder / "test_batch.bin").write_bytes(bytes([12]) + bytes(3072))
    with pytest.raises(ManytaskError, match="label 12"):
        load_cifar10(tmp_path)


def test_cifar10_benchmark(tmp_path: Path) -> None:
    write_cifar_bin(tmp_path / "cifar-10-batches-bin")
    assert "cifar10" in BENCHMARKS.names()
    full = build_benchmark("cifar10", {"root": str(tmp_path)}, seed=0)
    task = full.tasks["cifar10"]
    assert full.task_names == ["cifar10"] and full.input_shape == (3, 32, 32)
    assert task.spec.num_outputs == 10 and task.num_train == 7 and len(task.y_test) == 3
    assert len(full.metadata["classes"]) == 10
    params = {"root": str(tmp_path), "max_train": 4, "max_test": 2}
    small = build_benchmark("cifar10", params, seed=1).tasks["cifar10"]
    again = build_benchmark("cifar10", params, seed=1).tasks["cifar10"]
    assert small.x_train.shape == (4, 3, 32, 32) and small.x_test.shape == (2, 3, 32, 32)
    assert torch.equal(small.x_train, again.x_train) and torch.equal(small.y_test, again.y_test)
    rows = [int((task.x_train == x).all(dim=(1, 2, 3)).nonzero()) for x in small.x_train]
    assert rows == sorted(rows) and torch.equal(task.y_train[rows], small.y_train)  # a subset, original order
    others = [build_benchmark("cifar10", params, seed=s).tasks["cifar10"].y_train for s in range(2, 8)]
    assert any(not torch.equal(o, small.y_train) for o in others)
    with pytest.raises(ManytaskError, match="max_train"):
        build_benchmark("cifar10", {"root": str(tmp_path), "max_train": 0}, seed=0)


# ---------------------------------------------------------------- MNIST


@pytest.mark.parametrize("gz", [False, True])
def test_mnist_idx(tmp_path: Path, gz: bool) -> None:
    arrays = write_mnist(tmp_path, gz)
    suffix = ".gz" if gz else ""
    assert np.array_equal(read_idx(tmp_path / f"train-images-idx3-ubyte{suffix}"), arrays["train-images-idx3-ubyte"])
    labels = read_idx(tmp_path / f"t10k-labels-idx1-ubyte{suffix}")
    assert labels.dtype == np.uint8 and labels.tolist() == [7, 8, 9]
    x_train, y_train, x_test, y_test = load_mnist(tmp_path)
    assert x_train.shape == (5, 1, 28, 28) and x_test.shape == (3, 1, 28, 28)
    assert x_train.dtype == torch.float32 and y_train.dtype == torch.int64
    assert torch.equal(x_train[:, 0], torch.from_numpy(arrays["train-images-idx3-ubyte"]).float() / 255.0)
    assert torch.equal(x_test[:, 0], torch.from_numpy(arrays["t10k-images-idx3-ubyte"]).float() / 255.0)
    assert x_train[1, 0, 2, 3] == (13 + 10 + 3) / 255  # image 1, row 2, column 3
    assert y_train.tolist() == [0, 1, 2, 3, 4] and y_test.tolist() == [7, 8, 9]


def test_read_idx_errors(tmp_path: Path) -> None:
    data = idx_bytes(mnist_arrays(2, 0)[0])
    cases = {
        "short": (data[:-1], r"has 1583 bytes but its header \(2, 28, 28\) needs 1584"),
        "long": (data + b"\0", "needs 1584"),
        "header": (data[:9], "truncated inside its header"),
        "magic": (b"\0\0\x0d\x03" + data[4:], "not a uint8 IDX file"),
        "empty": (b"", "not a uint8 IDX file"),
    }
    for name, (content, message) in cases.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(ManytaskError, match=message):
            read_idx(tmp_path / name)
    (tmp_path / "cut.gz").write_bytes(gzip.compress(data)[:-10])
    with pytest.raises(ManytaskError, match=r"could not read IDX file .*cut\.gz"):
        read_idx(tmp_path / "cut.gz")
    (tmp_path / "bad.gz").write_bytes(data)
    with pytest.raises(ManytaskError, match="could not read IDX file"):
        read_idx(tmp_path / "bad.gz")


def test_mnist_missing_and_mismatched_files(tmp_path: Path) -> None:
    with pytest.raises(ManytaskError, match=r"train-images-idx3-ubyte \(or train-images-idx3-ubyte\.gz\) is missing"):
        load_mnist(tmp_path)
    write_mnist(tmp_path, gz=False)
    (tmp_path / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(ManytaskError, match=r"t10k-labels-idx1-ubyte .* is missing"):
        load_mnist(tmp_path)
    (tmp_path / "t10k-labels-idx1-ubyte.gz").write_bytes(gzip.compress(idx_bytes(np.zeros(4, np.uint8))))
    with pytest.raises(ManytaskError, match=r"has 3 images but .* has 4"):
        load_mnist(tmp_path)
    (tmp_path / "t10k-labels-idx1-ubyte.gz").unlink()
    (tmp_path / "t10k-labels-idx1-ubyte").write_bytes(idx_bytes(np.full(3, 10, np.uint8)))
    with pytest.raises(ManytaskError, match="label 10"):
        load_mnist(tmp_path)


def test_mnist_benchmark(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_mnist(tmp_path, gz=True)
    full = build_benchmark("mnist", {"root": str(tmp_path)}, seed=0)
    task = full.tasks["mnist"]
    assert full.input_shape == (1, 28, 28) and task.spec.num_outputs == 10 and task.num_train == 5
    params = {"root": str(tmp_path), "max_train": 3, "max_test": 1}
    small = build_benchmark("mnist", params, seed=4).tasks["mnist"]
    again = build_benchmark("mnist", params, seed=4).tasks["mnist"]
    assert small.num_train == 3 and len(small.y_test) == 1
    assert torch.equal(small.x_train, again.x_train) and torch.equal(small.y_train, again.y_train)
    assert small.y_train.tolist() == sorted(small.y_train.tolist())  # labels 0..4 in order: original order kept
    monkeypatch.setenv("MANYTASK_CACHE", str(tmp_path / "cache"))  # no root: the cache, where nothing is yet
    with pytest.raises(ManytaskError, match=r"MNIST file .* is missing; .*set download: true"):
        build_benchmark("mnist", {}, seed=0)
