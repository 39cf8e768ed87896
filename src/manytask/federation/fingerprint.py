"""Data identity: fingerprints of what a run trains and tests on, so a resumed run, a worker process, a SuperNode or
an exported partition that would silently train on other data is refused instead.

A config names its data but does not hold it: a user's benchmark can draw it unseeded, a file under `root` can be
replaced, an export can be of another config. The config hash cannot see any of that; these digests can.

- `task_fingerprint`: SHA-256 over a task's four tensors (dtype, shape, bytes), test sets included.
- `data_fingerprint`: every task's fingerprint plus the federation's client -> task -> indices: equal exactly when
  every client's training data and every test set are equal.
- `client_fingerprint`: one client's own rows (the tensors it trains on), for a place that holds only that
  client's data (a SuperNode, an exported partition).
"""

from __future__ import annotations

import hashlib
import json
import weakref

import numpy as np
import torch
from torch import Tensor

from manytask.federation.federation import Federation
from manytask.tasks.task import Task

FINGERPRINT_CHARS = 16  # hex characters kept: 64 bits, plenty to tell two data sets apart by accident

# id(x_train) -> (a weak reference to it, its task's digest): the members of a comparison share one benchmark's
# tensors, which are hashed once (a tensor's `==` is elementwise, so it cannot be a dictionary key itself)
_task_digests: dict[int, tuple[weakref.ref[Tensor], str]] = {}


def _update(digest: hashlib._Hash, tensor: Tensor) -> None:
    data = tensor.detach().cpu().contiguous()
    digest.update(json.dumps([str(data.dtype), list(data.shape)]).encode())
    digest.update(memoryview(data.reshape(-1).view(torch.uint8).numpy()) if data.numel() else b"")


def task_fingerprint(task: Task) -> str:
    """SHA-256 of the task's training and test tensors (hashed once per tensor object)."""
    key = id(task.x_train)
    cached = _task_digests.get(key)
    if cached is not None and cached[0]() is task.x_train:
        return cached[1]
    digest = hashlib.sha256()
    for tensor in (task.x_train, task.y_train, task.x_test, task.y_test):
        _update(digest, tensor)
    _task_digests[key] = weakref.ref(task.x_train, lambda _: _task_digests.pop(key, None)), digest.hexdigest()
    return _task_digests[key][1]


def data_fingerprint(tasks: dict[str, Task], federation: Federation) -> str:
    """The run's data: every task's tensors and which client holds which of their samples."""
    digest = hashlib.sha256()
    for name in sorted(tasks):
        digest.update(f"{name}:{task_fingerprint(tasks[name])};".encode())
    for client, holding in enumerate(federation.clients):
        for task in sorted(holding):
            digest.update(f"{client}/{task}:".encode())
            digest.update(np.ascontiguousarray(holding[task], dtype=np.int64).tobytes())
    return digest.hexdigest()[:FINGERPRINT_CHARS]


def client_fingerprint(data: dict[str, tuple[Tensor, Tensor]]) -> str:
    """One client's training data, task by task (inputs and targets as it trains on them)."""
    digest = hashlib.sha256()
    for task in sorted(data):
        digest.update(f"{task};".encode())
        for tensor in data[task]:
            _update(digest, tensor)
    return digest.hexdigest()[:FINGERPRINT_CHARS]
