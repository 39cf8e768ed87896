"""`download: true` of cifar10, cifar100, mnist and fashion-mnist against a loopback HTTP server serving small files
in the official formats: verified downloads that load, no second download, refused corrupt files, one sentence for
a missing file, MNIST's mirror fallback, and the `download: true` hint when files are absent."""

from __future__ import annotations

import gzip
import hashlib
import io
import pickle
import socket
import tarfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
import torch

from manytask.benchmarks import build_benchmark, download, fashion_mnist
from manytask.benchmarks.download import DATASETS, MIRROR_ENV
from manytask.errors import ManytaskError
from tests.data_files import batch_files, idx_bytes, mnist_arrays, write_cifar_py

# ---------------------------------------------------------------- fixture files and the loopback server


def tar_gz(folder: Path, arcname: str) -> bytes:
    """`folder` packed as `arcname/` in a gzipped tar, the layout of the official CIFAR archives."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(folder, arcname=arcname)
    return buffer.getvalue()


def cifar10_archive(tmp_path: Path) -> bytes:
    return tar_gz(write_cifar_py(tmp_path / "cifar10-src"), "cifar-10-batches-py")


def cifar100_archive(tmp_path: Path) -> bytes:
    folder = tmp_path / "cifar100-src"
    folder.mkdir()
    for name, count, offset in (("train", 12, 0), ("test", 4, 50)):
        index = np.arange(offset, offset + count)
        batch = {b"fine_labels": [int(i % 100) for i in index], b"coarse_labels": [int(i % 20) for i in index],
                 b"data": np.stack([np.full(3072, i, dtype=np.uint8) for i in index])}
        (folder / name).write_bytes(pickle.dumps(batch, protocol=4))
    return tar_gz(folder, "cifar-100-python")


def idx_gz_files() -> dict[str, bytes]:
    """The four gzipped IDX files: 5 training and 3 test images (see `tests/data_files.py`)."""
    (train_x, train_y), (test_x, test_y) = mnist_arrays(5, 0), mnist_arrays(3, 7)
    arrays = {"train-images-idx3-ubyte": train_x, "train-labels-idx1-ubyte": train_y,
              "t10k-images-idx3-ubyte": test_x, "t10k-labels-idx1-ubyte": test_y}
    return {f"{name}.gz": gzip.compress(idx_bytes(array)) for name, array in arrays.items()}


@dataclass
class Served:
    """A loopback server's base URL, the files it serves by URL path, and every path asked for."""

    url: str
    files: dict[str, bytes]
    requests: list[str] = field(default_factory=list)


@contextmanager
def serving(files: dict[str, bytes]) -> Iterator[Served]:
    """Serve `files` (URL path -> bytes; others 404) from 127.0.0.1 on a free port, in a thread."""
    served = Served("", files)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            served.requests.append(self.path)
            body = served.files.get(self.path)
            if body is None:
                self.send_error(404, "File not found")
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:  # keep the test output clean
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    served.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield served
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def official_digests_of(monkeypatch: pytest.MonkeyPatch, name: str, files: dict[str, bytes],
                        mirrors: tuple[str, ...] | None = None) -> None:
    """Make `files`' MD5s the expected ones of dataset `name` (and optionally its mirrors)."""
    dataset = DATASETS[name]
    remote = tuple(replace(f, md5=hashlib.md5(files[f.name]).hexdigest()) for f in dataset.files)
    monkeypatch.setitem(DATASETS, name, replace(dataset, files=remote, mirrors=mirrors or dataset.mirrors))


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The cache in `tmp_path`, no proxy between us and 127.0.0.1, and no mirror unless a test sets one."""
    monkeypatch.setenv("MANYTASK_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    monkeypatch.delenv(MIRROR_ENV, raising=False)
    return tmp_path / "cache"


def one_sentence(err: pytest.ExceptionInfo[ManytaskError], *pieces: str) -> str:
    message = str(err.value)
    assert message.endswith(".") and ". " not in message and "\n" not in message, message
    assert all(piece in message for piece in pieces), message
    return message


def files_under(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file())


# ---------------------------------------------------------------- downloads that load


def test_cifar10_downloads_into_the_cache_verifies_loads_and_is_not_fetched_again(
    tmp_path: Path, offline: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = {"cifar-10-python.tar.gz": cifar10_archive(tmp_path)}
    official_digests_of(monkeypatch, "cifar10", archive)
    with serving({"/cifar10/cifar-10-python.tar.gz": archive["cifar-10-python.tar.gz"]}) as server:
        monkeypatch.setenv(MIRROR_ENV, server.url)
        bench = build_benchmark("cifar10", {"download": True}, seed=0)
        assert server.requests == ["/cifar10/cifar-10-python.tar.gz"]
        again = build_benchmark("cifar10", {"download": True}, seed=0)
        assert len(server.requests) == 1
    folder = offline / "datasets" / "cifar10"
    assert bench.metadata["root"] == str(folder)
    assert [p.name for p in files_under(folder)] == sorted(name for name, _ in batch_files())
    batches = [batch for _, batch in batch_files()]
    task = bench.tasks["cifar10"]
    assert task.x_train.shape == (7, 3, 32, 32) and task.x_test.shape == (3, 3, 32, 32)
    assert task.y_train.tolist() == [label for _, labels in batches[:-1] for label in labels]
    assert task.y_test.tolist() == batches[-1][1]
    pixels = np.concatenate([data for data, _ in batches[:-1]]).reshape(-1, 3, 32, 32)
    assert torch.equal((task.x_train * 255).round().to(torch.uint8), torch.from_numpy(pixels))
    assert torch.equal(again.tasks["cifar10"].x_test, task.x_test)


def test_cifar100_downloads_into_a_given_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    archive = {"cifar-100-python.tar.gz": cifar100_archive(tmp_path)}
    official_digests_of(monkeypatch, "cifar100", archive)
    with serving({"/cifar100/cifar-100-python.tar.gz": archive["cifar-100-python.tar.gz"]}) as server:
        monkeypatch.setenv(MIRROR_ENV, server.url + "/")
        params = {"root": str(tmp_path / "c100"), "download": True, "labels": "coarse"}
        task = build_benchmark("cifar100", params, seed=0).tasks["cifar100"]
        build_benchmark("cifar100", params, seed=0)
        assert len(server.requests) == 1
    assert task.x_train.shape == (12, 3, 32, 32) and task.spec.num_outputs == 20
    assert task.y_train.tolist() == [i % 20 for i in range(12)]
    assert task.y_test.tolist() == [i % 20 for i in range(50, 54)]
    assert float(task.x_test[1].max()) == pytest.approx(51 / 255)
    assert [p.name for p in files_under(tmp_path / "c100")] == ["test", "train"]


@pytest.mark.parametrize("name", ["mnist", "fashion-mnist"])
def test_idx_datasets_download_their_four_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    files = idx_gz_files()
    official_digests_of(monkeypatch, name, files)
    with serving({f"/{name}/{file}": body for file, body in files.items()}) as server:
        monkeypatch.setenv(MIRROR_ENV, server.url)
        params = {"root": str(tmp_path / name), "download": True}
        task = build_benchmark(name, params, seed=0).tasks[name]
        build_benchmark(name, params, seed=0)
        assert sorted(server.requests) == sorted(f"/{name}/{file}" for file in files)
    (train_x, train_y), (test_x, test_y) = mnist_arrays(5, 0), mnist_arrays(3, 7)
    assert task.x_train.shape == (5, 1, 28, 28) and task.y_train.tolist() == train_y.tolist()
    assert task.y_test.tolist() == test_y.tolist()
    assert torch.equal((task.x_train * 255).round().to(torch.uint8)[:, 0], torch.from_numpy(train_x))
    assert torch.equal((task.x_test * 255).round().to(torch.uint8)[:, 0], torch.from_numpy(test_x))
    assert {p.name for p in files_under(tmp_path / name)} == set(files)


def test_fashion_mnist_without_the_debian_folder_downloads_into_the_cache(
    tmp_path: Path, offline: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    absent = str(tmp_path / "usr-share-datasets-fashion-mnist")
    monkeypatch.setattr(fashion_mnist, "DEFAULT_ROOT", absent)
    files = idx_gz_files()
    official_digests_of(monkeypatch, "fashion-mnist", files)
    with serving({f"/fashion-mnist/{file}": body for file, body in files.items()}) as server:
        monkeypatch.setenv(MIRROR_ENV, server.url)
        bench = build_benchmark("fashion-mnist", {"root": absent, "download": True}, seed=0)
    assert bench.metadata["root"] == str(offline / "datasets" / "fashion-mnist") and not Path(absent).exists()


def test_mnist_falls_back_to_its_second_mirror(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = idx_gz_files()
    with socket.socket() as refusing, serving({f"/mnist/{file}": body for file, body in files.items()}) as server:
        refusing.bind(("127.0.0.1", 0))  # bound but not listening: connections to it are refused
        first = f"http://127.0.0.1:{refusing.getsockname()[1]}/"
        official_digests_of(monkeypatch, "mnist", files, mirrors=(first, server.url + "/mnist/"))
        task = build_benchmark("mnist", {"root": str(tmp_path / "m"), "download": True}, seed=0).tasks["mnist"]
        assert len(server.requests) == 4
    assert task.num_train == 5 and len(task.y_test) == 3


def test_large_downloads_report_progress_on_stderr(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(download, "PROGRESS_MIN_BYTES", 0)
    monkeypatch.setattr(download, "CHUNK", 100)  # the gzipped training images (679 bytes) arrive in 7 reads
    files = idx_gz_files()
    official_digests_of(monkeypatch, "mnist", files)
    with serving({f"/mnist/{file}": body for file, body in files.items()}) as server:
        monkeypatch.setenv(MIRROR_ENV, server.url)
        build_benchmark("mnist", {"root": str(tmp_path / "m"), "download": True}, seed=0)
    err = capsys.readouterr().err
    assert "downloading MNIST file train-images-idx3-ubyte.gz from http://127.0.0.1:" in err
    shown = [line.split(": ")[1] for line in err.splitlines() if line.startswith("train-images-idx3-ubyte.gz: ")]
    assert shown == [f"{p} % of 0.0 MB" for p in (10, 20, 40, 50, 70, 80, 100)]


# ---------------------------------------------------------------- refusals


def test_a_corrupted_download_is_refused_and_deleted(
    tmp_path: Path, offline: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = cifar10_archive(tmp_path)
    official_digests_of(monkeypatch, "cifar10", {"cifar-10-python.tar.gz": archive})
    corrupted = archive[:-1] + bytes([archive[-1] ^ 1])
    with serving({"/cifar10/cifar-10-python.tar.gz": corrupted}) as server:
        monkeypatch.setenv(MIRROR_ENV, server.url)
        with pytest.raises(ManytaskError) as err:
            build_benchmark("cifar10", {"download": True}, seed=0)
    url = f"{server.url}/cifar10/cifar-10-python.tar.gz"
    one_sentence(err, "CIFAR-10 file cifar-10-python.tar.gz", url, hashlib.md5(corrupted).hexdigest(),
                 hashlib.md5(archive).hexdigest(), "deleted")
    assert files_under(offline) == []


def test_a_file_missing_on_the_server_is_one_sentence(
    tmp_path: Path, offline: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = idx_gz_files()
    official_digests_of(monkeypatch, "mnist", files)
    served = {f"/mnist/{file}": body for file, body in files.items() if not file.startswith("t10k-labels")}
    with serving(served) as server:
        monkeypatch.setenv(MIRROR_ENV, server.url)
        with pytest.raises(ManytaskError) as err:
            build_benchmark("mnist", {"download": True}, seed=0)
    one_sentence(err, "could not download MNIST file t10k-labels-idx1-ubyte.gz",
                 f"{server.url}/mnist/t10k-labels-idx1-ubyte.gz (HTTP 404 File not found)")
    kept = [p.name for p in files_under(offline)]  # the three files that were served and verified, nothing else
    assert kept == sorted(file for file in files if not file.startswith("t10k-labels"))


@pytest.mark.parametrize(("name", "title"), [
    ("cifar10", "CIFAR-10"), ("cifar100", "CIFAR-100"), ("mnist", "MNIST"), ("fashion-mnist", "Fashion-MNIST"),
])
def test_absent_files_without_download_point_at_download_true(
    tmp_path: Path, offline: Path, name: str, title: str
) -> None:
    with pytest.raises(ManytaskError) as err:
        build_benchmark(name, {"root": None}, seed=0)
    folder = offline / "datasets" / name
    one_sentence(err, f"{title} file {folder}", "is missing", f"set download: true to fetch them into {folder}.")
    assert not offline.exists()  # nothing is created without download: true
