"""CIFAR-100 from small files written in the Python version's format: fine and coarse labels, subsets, the
restricted unpickler, and one sentence for a missing file."""

import pickle

import numpy as np
import pytest

from manytask.benchmarks import build_benchmark
from manytask.errors import ManytaskError


def _batch(count: int, offset: int) -> dict:
    index = np.arange(offset, offset + count)
    return {
        b"filenames": [f"{i}.png".encode() for i in index], b"batch_label": b"training batch 1 of 1",
        b"fine_labels": [int(i % 100) for i in index], b"coarse_labels": [int(i % 20) for i in index],
        b"data": np.stack([np.full(3072, i % 256, dtype=np.uint8) for i in index]),
    }


def _write(root, train=120, test=30):
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    (folder / "train").write_bytes(pickle.dumps(_batch(train, 0), protocol=4))
    (folder / "test").write_bytes(pickle.dumps(_batch(test, 1000), protocol=3))
    return root


def test_fine_and_coarse_labels_load_from_the_python_files(tmp_path):
    root = _write(tmp_path)
    fine = build_benchmark("cifar100", {"root": str(root)}, seed=0).tasks["cifar100"]
    assert fine.x_train.shape == (120, 3, 32, 32) and fine.x_test.shape == (30, 3, 32, 32)
    assert fine.spec.num_outputs == 100 and fine.y_train.tolist() == [i % 100 for i in range(120)]
    assert float(fine.x_train[5].max()) == pytest.approx(5 / 255)
    coarse = build_benchmark("cifar100", {"root": str(root), "labels": "coarse", "max_train": 40}, seed=0)
    task = coarse.tasks["cifar100"]
    assert task.spec.num_outputs == 20 and len(task.y_train) == 40 and int(task.y_train.max()) < 20


def test_a_missing_file_is_named(tmp_path):
    root = _write(tmp_path)
    (root / "cifar-100-python" / "test").unlink()
    with pytest.raises(ManytaskError, match=r"CIFAR-100 file .*cifar-100-python/test is missing"):
        build_benchmark("cifar100", {"root": str(root)}, seed=0)


def test_a_pickle_naming_another_global_is_refused_before_it_runs(tmp_path):
    root = _write(tmp_path)

    class Evil:
        def __reduce__(self):
            return (print, ("ran",))

    (root / "cifar-100-python" / "train").write_bytes(pickle.dumps({b"data": Evil()}, protocol=4))
    with pytest.raises(ManytaskError, match="is not a safe CIFAR pickle"):
        build_benchmark("cifar100", {"root": str(root)}, seed=0)


def test_labels_out_of_range_are_refused(tmp_path):
    root = _write(tmp_path)
    batch = _batch(10, 0)
    batch[b"fine_labels"][3] = 100
    (root / "cifar-100-python" / "train").write_bytes(pickle.dumps(batch, protocol=4))
    with pytest.raises(ManytaskError, match="has label 100; labels must be 0-99"):
        build_benchmark("cifar100", {"root": str(root)}, seed=0)
