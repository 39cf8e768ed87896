"""Fashion-MNIST: the IDX reader on tiny files (MNIST's names and format), the `fashion-mnist` benchmark, the
personal-task benchmarks over it, one-sentence errors, and the real files where the Debian package put them."""

from __future__ import annotations

import gzip
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from manytask.benchmarks import BENCHMARKS, build_benchmark, personal
from manytask.benchmarks.fashion_mnist import CLASSES, DEFAULT_ROOT, load_fashion_mnist
from manytask.benchmarks.mnist import MNIST_FILES
from manytask.benchmarks.rotated_masked import cluster_of
from manytask.errors import ManytaskError
from tests.data_files import idx_bytes, mnist_arrays, write_mnist
from tests.test_label_skew import check_label_skew

REAL_FILES_PRESENT = all(
    (Path(DEFAULT_ROOT) / name).is_file() or (Path(DEFAULT_ROOT) / f"{name}.gz").is_file() for name in MNIST_FILES
)


def as_float(images: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(images).float().div(255)[:, None]


def one_sentence_error(call, *pieces: str) -> str:
    """The ManytaskError of `call()`: one sentence naming Fashion-MNIST and every piece (paths) given."""
    with pytest.raises(ManytaskError) as info:
        call()
    message = str(info.value)
    assert message.endswith(".") and ". " not in message and "\n" not in message, message
    assert "Fashion-MNIST" in message and all(piece in message for piece in pieces), message
    return message


# ---------------------------------------------------------------- the reader


@pytest.mark.parametrize("gz", [False, True])
def test_reader_on_plain_and_gzipped_files(tmp_path: Path, gz: bool) -> None:
    arrays = write_mnist(tmp_path, gz, num_train=6, num_test=4)
    assert {p.name for p in tmp_path.iterdir()} == {name + (".gz" if gz else "") for name in MNIST_FILES}
    x_train, y_train, x_test, y_test = load_fashion_mnist(tmp_path)
    assert x_train.shape == (6, 1, 28, 28) and x_test.shape == (4, 1, 28, 28)
    assert x_train.dtype == x_test.dtype == torch.float32 and y_train.dtype == y_test.dtype == torch.int64
    assert x_train.min() >= 0 and x_train.max() <= 1 and x_test.min() >= 0 and x_test.max() <= 1
    assert torch.equal(x_train, as_float(arrays["train-images-idx3-ubyte"]))
    assert torch.equal(x_test, as_float(arrays["t10k-images-idx3-ubyte"]))
    # by hand: pixel (r, c) of image n is (13·n + 5·r + c) mod 256; test images are numbered from 7
    assert x_train[1, 0, 2, 3] == (13 + 10 + 3) / 255 and x_train[5, 0, 27, 27] == (65 + 135 + 27) % 256 / 255
    assert x_test[0, 0, 0, 0] == 91 / 255 and x_test[3, 0, 1, 2] == (130 + 5 + 2) / 255
    assert y_train.tolist() == [0, 1, 2, 3, 4, 5] and y_test.tolist() == [7, 8, 9, 0]


# ---------------------------------------------------------------- the benchmark


def test_fashion_mnist_benchmark_from_root(tmp_path: Path) -> None:
    write_mnist(tmp_path, gz=True, num_train=12, num_test=6)
    assert "fashion-mnist" in BENCHMARKS.names()
    assert BENCHMARKS.parse_params("fashion-mnist", {}).root == DEFAULT_ROOT == "/usr/share/datasets/fashion-mnist"
    full = build_benchmark("fashion-mnist", {"root": str(tmp_path)}, seed=0)
    task = full.tasks["fashion-mnist"]
    assert full.task_names == ["fashion-mnist"] and task.name == "fashion-mnist"
    assert full.input_shape == (1, 28, 28) and task.spec.num_outputs == 10
    assert task.num_train == 12 and len(task.y_test) == 6
    assert full.metadata["classes"] == list(CLASSES) and len(CLASSES) == 10
    assert "Ankle boot" in full.description and "T-shirt/top" in full.description
    params = {"root": str(tmp_path), "max_train": 5, "max_test": 2}
    small = build_benchmark("fashion-mnist", params, seed=3).tasks["fashion-mnist"]
    again = build_benchmark("fashion-mnist", params, seed=3).tasks["fashion-mnist"]
    assert small.num_train == 5 and len(small.y_test) == 2 and small.name == "fashion-mnist"
    assert torch.equal(small.x_train, again.x_train) and torch.equal(small.y_test, again.y_test)
    rows = [int((task.x_train == x).all(dim=(1, 2, 3)).nonzero()) for x in small.x_train]
    assert rows == sorted(rows) and torch.equal(task.y_train[rows], small.y_train)  # a subset, in file order


# ---------------------------------------------------------------- as a source of the personal-task benchmarks


def test_rotated_masked_on_fashion_mnist(tmp_path: Path) -> None:
    files = write_mnist(tmp_path, gz=True, num_train=80, num_test=40)
    params = {"source": "fashion-mnist", "root": str(tmp_path), "num_clients": 8}
    masked = build_benchmark("rotated-masked-digits", params, seed=0)
    plain = build_benchmark("rotated-masked-digits", {**params, "patch_prob": 0.0}, seed=0)
    assert masked.input_shape == (1, 28, 28) and len(masked.tasks) == 8
    assert masked.metadata["groups"] == {f"client{i:02d}": i // 2 for i in range(8)}
    assert "Fashion-MNIST" in masked.description
    originals = as_float(files["train-images-idx3-ubyte"])
    for client, name in enumerate(plain.tasks):
        rotated = {r.numpy().tobytes() for r in torch.rot90(originals, cluster_of(client, 8, 4), dims=(2, 3))}
        assert {r.numpy().tobytes() for r in plain.tasks[name].x_train} <= rotated
        assert masked.tasks[name].description.startswith(f"client {client}: images rotated by")
    assert sum(t.num_train for t in masked.tasks.values()) == 80
    assert sum(len(t.y_test) for t in masked.tasks.values()) == 40


def test_label_skew_on_fashion_mnist(tmp_path: Path) -> None:
    write_mnist(tmp_path, gz=False, num_train=200, num_test=100)  # 20 training, 10 test images per class
    bench = build_benchmark("label-skew", {"source": "fashion-mnist", "root": str(tmp_path), "num_clients": 10},
                            seed=0)
    check_label_skew(bench, 10)
    assert bench.input_shape == (1, 28, 28) and "Fashion-MNIST" in bench.description


def test_personal_source_without_root_reads_the_default_folder(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(personal.DEFAULT_ROOTS, "fashion-mnist", str(tmp_path / "absent"))
    one_sentence_error(lambda: build_benchmark("label-skew", {"source": "fashion-mnist"}, seed=0),
                       str(tmp_path / "absent" / "train-images-idx3-ubyte"))
    write_mnist(tmp_path / "absent", gz=True, num_train=80, num_test=40)
    bench = build_benchmark("rotated-masked-digits", {"source": "fashion-mnist", "num_clients": 4}, seed=0)
    assert len(bench.tasks) == 4 and sum(t.num_train for t in bench.tasks.values()) == 80
    with pytest.raises(ManytaskError, match=r"source 'mnist' needs 'root', the folder of the MNIST files\.$"):
        build_benchmark("label-skew", {"source": "mnist"}, seed=0)  # MNIST has no default folder


# ---------------------------------------------------------------- errors


def test_errors_name_fashion_mnist_and_the_file(tmp_path: Path) -> None:
    def load() -> None:
        load_fashion_mnist(tmp_path)

    message = one_sentence_error(load, str(tmp_path / "train-images-idx3-ubyte"))
    assert message.startswith("Fashion-MNIST file") and "is missing" in message
    write_mnist(tmp_path, gz=False, num_train=2, num_test=2)
    (tmp_path / "t10k-labels-idx1-ubyte").unlink()
    assert "t10k-labels-idx1-ubyte.gz) is missing" in one_sentence_error(load, str(tmp_path))

    (tmp_path / "t10k-labels-idx1-ubyte").write_bytes(idx_bytes(np.zeros(2, np.uint8)))
    images = tmp_path / "train-images-idx3-ubyte"
    data = images.read_bytes()
    images.write_bytes(b"\0\0\x0d\x03" + data[4:])  # wrong magic (a float IDX type)
    assert "is not a uint8 IDX file" in one_sentence_error(load, str(images))
    images.write_bytes(data[:-100])  # truncated pixel data
    message = one_sentence_error(load, str(images))
    assert re.search(r"is truncated: it has 1484 bytes but its header \(2, 28, 28\) needs 1584\.$", message)
    images.write_bytes(data[:10])  # truncated header
    assert "truncated inside its header" in one_sentence_error(load, str(images))

    images.unlink()
    gz = tmp_path / "train-images-idx3-ubyte.gz"
    gz.write_bytes(gzip.compress(idx_bytes(mnist_arrays(2, 0)[0]))[:-12])  # a cut download
    assert "could not read Fashion-MNIST IDX file" in one_sentence_error(load, str(gz))
    one_sentence_error(lambda: build_benchmark("fashion-mnist", {"root": str(tmp_path)}, seed=0), str(gz))


# ---------------------------------------------------------------- the real files


NOT_INSTALLED = "Fashion-MNIST is not installed: apt-get install dataset-fashion-mnist"


@pytest.mark.skipif(not REAL_FILES_PRESENT, reason=NOT_INSTALLED)
def test_real_files_in_the_default_folder() -> None:
    bench = build_benchmark("fashion-mnist", {"max_train": 2000, "max_test": 500}, seed=0)
    task = bench.tasks["fashion-mnist"]
    assert bench.metadata["root"] == DEFAULT_ROOT and task.spec.num_outputs == 10
    assert task.x_train.shape == (2000, 1, 28, 28) and task.x_test.shape == (500, 1, 28, 28)
    assert task.y_train.unique().tolist() == list(range(10)) == task.y_test.unique().tolist()
    assert 0.26 < float(task.x_train.mean()) < 0.31  # the full training set's mean pixel is about 0.286
    assert task.x_train.min() == 0 and task.x_train.max() == 1
