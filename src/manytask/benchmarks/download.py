"""Fetching a dataset's official files into a folder (by default the cache `$MANYTASK_CACHE/datasets/<name>`), for
the `download: true` of the `cifar10`, `cifar100`, `mnist` and `fashion-mnist` benchmarks.

Each file is streamed from the first mirror that answers into a temporary file beside its destination, its MD5 (the
checksum the publishers and torchvision give for these files) is compared with the official one, and only then is
it moved into place with `os.replace`: an interrupted or corrupted download never leaves a file the loaders would
read, and a file whose digest differs is deleted and refused. A `.tar.gz` archive is then unpacked with tarfile's
`data` filter (no absolute paths, no escapes from the folder, no devices) and removed, since the loaders read the
unpacked files; `.gz` IDX files stay compressed, as the MNIST reader takes them.

`MANYTASK_DATASETS_MIRROR` replaces the official URLs by `<mirror>/<name>/<file>` (a local copy, or a loopback
server in the tests); `<name>` keeps MNIST and Fashion-MNIST apart, as they share their file names.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tarfile
import tempfile
import urllib.request
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO
from urllib.error import HTTPError, URLError

from manytask.errors import ManytaskError

MIRROR_ENV = "MANYTASK_DATASETS_MIRROR"
CHUNK = 1 << 20  # bytes read per step: bounded memory whatever the file size
PROGRESS_MIN_BYTES = 8 << 20  # smaller files arrive quickly enough to need no progress lines
TIMEOUT_S = 60.0  # per connection attempt and read: a stalled mirror fails over instead of hanging the run


@dataclass(frozen=True)
class RemoteFile:
    """One file as published: its name on the servers (and in the folder) and its official MD5."""

    name: str
    md5: str


@dataclass(frozen=True)
class RemoteDataset:
    """A dataset's official files: `name` is the benchmark's and its cache folder's, `title` the one in messages,
    `mirrors` the base URLs tried in order."""

    name: str
    title: str
    mirrors: tuple[str, ...]
    files: tuple[RemoteFile, ...]


def _idx_files(md5s: tuple[str, str, str, str]) -> tuple[RemoteFile, ...]:
    """MNIST's four gzipped IDX files (Fashion-MNIST shares the names) with their digests in that order."""
    names = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
    return tuple(RemoteFile(f"{name}.gz", md5) for name, md5 in zip(names, md5s, strict=True))


DATASETS: dict[str, RemoteDataset] = {d.name: d for d in (
    RemoteDataset("cifar10", "CIFAR-10", ("https://www.cs.toronto.edu/~kriz/",),
                  (RemoteFile("cifar-10-python.tar.gz", "c58f30108f718f92721af3b95e74349a"),)),
    RemoteDataset("cifar100", "CIFAR-100", ("https://www.cs.toronto.edu/~kriz/",),
                  (RemoteFile("cifar-100-python.tar.gz", "eb9058c3a382ffc7106e4002c42a8d85"),)),
    RemoteDataset("mnist", "MNIST", (
        "https://ossci-datasets.s3.amazonaws.com/mnist/", "https://storage.googleapis.com/cvdf-datasets/mnist/",
        "http://yann.lecun.com/exdb/mnist/",
    ), _idx_files(("f68b3c2dcbeaaa9fbdd348bbdeb94873", "d53e105ee54ea40749a09fcbcd1e9432",
                   "9fb629c4189551a2d022fa330f9573f3", "ec29112dd5afa0611ce80d1b7f02629c"))),
    RemoteDataset("fashion-mnist", "Fashion-MNIST", (
        "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
        "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/data/fashion/",
    ), _idx_files(("8d4fb7e6c68d591d4c3dfef9ec88bf0d", "25c81989df183df01b3e8a0aad5dffbe",
                   "bef4ecab320f06d8554ea6380940ec79", "bb300cfdad3c16e7a12a480ee83cd310"))),
)}


def cache_root(name: str) -> Path:
    """Where dataset `name` is read from and downloaded to when no `root` is given: beside the pretrained
    backbones, under `$MANYTASK_CACHE` (default `~/.cache/manytask`)."""
    return Path(os.environ.get("MANYTASK_CACHE", Path.home() / ".cache" / "manytask")) / "datasets" / name


def base_urls(dataset: RemoteDataset) -> tuple[str, ...]:
    """The mirrors to try in order: `$MANYTASK_DATASETS_MIRROR/<name>/` alone when set, else the official ones."""
    mirror = os.environ.get(MIRROR_ENV)
    return (f"{mirror.rstrip('/')}/{dataset.name}/",) if mirror else dataset.mirrors


def fetch(dataset: RemoteDataset, root: Path) -> None:
    """Download every file of `dataset` missing from `root`, verified, and unpack the archives among them."""
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ManytaskError(f"cannot create {dataset.title} folder {root} ({err}); set root to a writable folder.") \
            from None
    for remote in dataset.files:
        path = root / remote.name
        if not path.is_file():
            _download(dataset, remote, path)
        if path.name.endswith(".tar.gz"):
            _unpack(path, dataset.title)


def _download(dataset: RemoteDataset, remote: RemoteFile, path: Path) -> None:
    """`remote` into `path` from the first mirror that delivers it; a mirror that cannot be reached or answers an
    HTTP error passes to the next one, as torchvision does, while a wrong digest stops at once."""
    failures = []
    for url in (base + remote.name for base in base_urls(dataset)):
        try:
            _download_from(url, dataset.title, remote, path)
            return
        except OSError as err:  # URLError, HTTPError, refused connections and timeouts are all OSErrors
            failures.append(f"{url} ({_reason(err)})")
    raise ManytaskError(f"could not download {dataset.title} file {remote.name}: {'; '.join(failures)}.")


def _download_from(url: str, title: str, remote: RemoteFile, path: Path) -> None:
    """Stream `url` into a temporary file in `path`'s folder and move it to `path` only when its MD5 is the
    official one; the temporary file is removed whatever happens."""
    print(f"downloading {title} file {remote.name} from {url} into {path.parent}", file=sys.stderr, flush=True)
    handle, part = tempfile.mkstemp(dir=path.parent, prefix=f".{remote.name}.", suffix=".part")
    try:
        with os.fdopen(handle, "wb") as out:
            digest = _copy(url, out, remote.name)
        if digest != remote.md5:
            raise ManytaskError(
                f"{title} file {remote.name} downloaded from {url} has MD5 {digest}, not the official {remote.md5}, "
                f"so it was deleted."
            )
        os.replace(part, path)
    finally:
        Path(part).unlink(missing_ok=True)


def _copy(url: str, out: BinaryIO, label: str) -> str:
    """Write the body of `url` to `out` chunk by chunk, with a stderr line per tenth of a large file; its MD5."""
    md5 = hashlib.md5(usedforsecurity=False)  # matches the published digests; not used for security
    with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
        total = int(response.headers.get("Content-Length") or 0)
        done, shown = 0, 0
        while chunk := response.read(CHUNK):
            out.write(chunk)
            md5.update(chunk)
            done += len(chunk)
            if total >= PROGRESS_MIN_BYTES and done * 10 // total > shown:
                shown = done * 10 // total
                print(f"{label}: {10 * shown} % of {total / 1e6:.1f} MB", file=sys.stderr, flush=True)
    return md5.hexdigest()


def _reason(err: OSError) -> str:
    """A short reason for one mirror's failure, for the one-sentence error listing them."""
    if isinstance(err, HTTPError):
        err.close()  # the error holds the open response
        return f"HTTP {err.code} {err.reason}"
    reason = err.reason if isinstance(err, URLError) else err
    return str(reason).rstrip(".")


def _unpack(archive: Path, title: str) -> None:
    """Unpack a verified `.tar.gz` beside itself with tarfile's `data` filter, then remove it."""
    try:
        with tarfile.open(archive, "r:gz") as tar:
            tar.extractall(archive.parent, filter="data")
    except (tarfile.TarError, OSError, EOFError, zlib.error) as err:
        raise ManytaskError(f"could not unpack {title} archive {archive}: {err}.") from None
    archive.unlink()
