"""What stays on the training device between a runner's calls: the clients' data, the test sets and client states.

A client's training tensors and a task's test set move to the device once per run, not at every call: a
`ResidentData` keeps their device copies, most recently used last, while they fit its byte capacity; past it, the
least recently used copy is dropped (the tensors still come from the host cache and move again at their next use).
A client's state stays on the device after its call while all resident states fit a `ResidentStates` capacity;
a state that does not fit goes back to host memory and moves at its next call. Nothing here changes a value: a
state or data tensor is the same numbers wherever it lies, and whoever serializes one (a checkpoint, a worker, a
Flower client's context) copies it to the host there."""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping

import torch
from torch import Tensor

from manytask.client.trainer import TaskData
from manytask.devices import CPU

CACHED_CLIENTS = 1024  # clients whose host tensors stay materialized: memory is bounded, not ∝ the federation


def data_bytes(data: TaskData) -> int:
    return sum(t.numel() * t.element_size() for pair in data.values() for t in pair)


def state_bytes(state: Mapping[str, Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


def _spill_notice(what: str, capacity: int) -> None:
    """`what` ("the clients' data exceeds", ...) past the bytes kept on the device: said once."""
    print(f"{what} the {capacity / 2**30:.2f} GB kept on the device: the least recently used move at each use",
          file=sys.stderr)


class ResidentData:
    """Training data per client and test sets per task, on `device`, moved once while they fit `capacity` bytes."""

    def __init__(self, load: Callable[[int], TaskData], load_test: Callable[[list[str]], TaskData],
                 device: torch.device, capacity: int) -> None:
        self._load, self._load_test, self.device, self.capacity = load, load_test, device, capacity
        self._host: OrderedDict[int, TaskData] = OrderedDict()  # most recently asked-for clients last
        self._device: OrderedDict[Hashable, TaskData] = OrderedDict()
        self._held = 0  # bytes of the device copies
        self.moves = 0  # copies made to the device (a test counts them)
        self.spilled = False

    def client(self, client: int) -> TaskData:
        """The client's training tensors per held task, on the device."""
        host = self._host.pop(client, None)
        if host is None:
            host = self._load(client)
        self._host[client] = host
        if len(self._host) > CACHED_CLIENTS:
            self._host.popitem(last=False)
        return self._resident(("train", client), host)

    def test(self, tasks: list[str]) -> TaskData:
        """The test sets of `tasks`, on the device: each task's moved once."""
        return {task: self._resident(("test", task), self._load_test([task]))[task] for task in tasks}

    def _resident(self, key: Hashable, host: TaskData) -> TaskData:
        if self.device == CPU:
            return host
        held = self._device.pop(key, None)
        if held is not None:
            self._device[key] = held
            return held
        moved = {task: (x.to(self.device), y.to(self.device)) for task, (x, y) in host.items()}
        self.moves += 1
        size = data_bytes(moved)
        while self._device and self._held + size > self.capacity:
            self._held -= data_bytes(self._device.popitem(last=False)[1])
            self._spill()
        if size <= self.capacity:
            self._device[key] = moved
            self._held += size
        else:
            self._spill()
        return moved

    def _spill(self) -> None:
        if not self.spilled:
            self.spilled = True
            _spill_notice("the clients' data exceeds", self.capacity)


class ResidentStates:
    """Where each client's state lies between its calls: on `device` while every resident state fits `capacity`
    bytes, else in host memory."""

    def __init__(self, device: torch.device, capacity: int) -> None:
        self.device, self.capacity = device, capacity
        self._held: dict[int, int] = {}  # client -> bytes of its state on the device
        self.spilled = False

    def keep(self, client: int, state: dict[str, Tensor]) -> None:
        """After the client's call: its state left on the device if it fits, else moved to host memory."""
        if self.device == CPU:
            return
        self._held.pop(client, None)
        size = state_bytes(state)
        if sum(self._held.values()) + size <= self.capacity:
            self._held[client] = size
            return
        state.update({k: v.to(CPU) for k, v in state.items()})
        if not self.spilled:
            self.spilled = True
            _spill_notice("the client states exceed", self.capacity)
